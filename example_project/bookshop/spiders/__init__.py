"""The spiders of the bookshop project."""
