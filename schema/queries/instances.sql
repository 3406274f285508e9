-- name: UpsertInstanceType
INSERT INTO trnflow.instance_types (name, family, pool, accelerator, chips, cores_per_chip,
  hbm_gib_per_chip, hbm_gbps_per_chip, bf16_tflops_per_chip, fp8_tflops_per_chip, vcpus,
  memory_gib, network_gbps, spot_interruption_bucket, sources)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15::jsonb)
ON CONFLICT (name) DO UPDATE SET family = EXCLUDED.family, pool = EXCLUDED.pool,
  accelerator = EXCLUDED.accelerator, chips = EXCLUDED.chips,
  cores_per_chip = EXCLUDED.cores_per_chip, hbm_gib_per_chip = EXCLUDED.hbm_gib_per_chip,
  hbm_gbps_per_chip = EXCLUDED.hbm_gbps_per_chip,
  bf16_tflops_per_chip = EXCLUDED.bf16_tflops_per_chip,
  fp8_tflops_per_chip = EXCLUDED.fp8_tflops_per_chip, vcpus = EXCLUDED.vcpus,
  memory_gib = EXCLUDED.memory_gib, network_gbps = EXCLUDED.network_gbps,
  spot_interruption_bucket = EXCLUDED.spot_interruption_bucket, sources = EXCLUDED.sources;

-- name: InsertPriceIfChanged
-- A new row only when the price differs from the one in force at $2: history stays as it was.
INSERT INTO trnflow.prices (instance_type, valid_from, on_demand_usd_hour, spot_usd_hour)
SELECT $1, $2::timestamptz, $3::numeric, $4::numeric
WHERE NOT EXISTS (
  SELECT 1 FROM (
    SELECT on_demand_usd_hour, spot_usd_hour FROM trnflow.prices
    WHERE instance_type = $1 AND valid_from <= $2::timestamptz
    ORDER BY valid_from DESC LIMIT 1) cur
  WHERE cur.on_demand_usd_hour = $3::numeric AND cur.spot_usd_hour = $4::numeric)
ON CONFLICT (instance_type, valid_from) DO UPDATE
  SET on_demand_usd_hour = EXCLUDED.on_demand_usd_hour, spot_usd_hour = EXCLUDED.spot_usd_hour;
