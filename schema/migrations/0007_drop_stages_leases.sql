-- Heartbeats renew leases by stage id now; no query reads stages by lease owner, and the index
-- cost every claim an insertion.
DROP INDEX IF EXISTS trnflow.stages_leases;
