-- What a finished stage produced, so the stages after it can key their cache on it: the
-- digest of its artifact (a compiled graph, a cached stage's stored outputs, the files a run:
-- stage declared), or NULL when its outputs are unknown. And the inputs of the key a cached
-- stage computed when it ran, for `trnflow cache why`.
ALTER TABLE trnflow.stages ADD COLUMN output_digest text;
ALTER TABLE trnflow.stages ADD COLUMN cache_inputs text;
