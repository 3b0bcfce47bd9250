"""Files to ranks: which files a PATH names, Kineto decoding, the Parquet cache, the tracer's
records, and `load_path`, which gives one RankTrace per rank (analysis.ingest.load)."""
