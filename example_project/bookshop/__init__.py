"""An example Scrapy project that uses scrapy-reliability (see ../README.md)."""
