"""Test helpers: a fault-injecting local site. Not a stable API."""
