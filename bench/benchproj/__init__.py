"""A minimal Scrapy project for the benchmarks in bench/ (no item pipeline, no files written)."""
