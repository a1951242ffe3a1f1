"""Curation: raw web images -> Humans-1B-style WebDataset shards, a manifest and stats, on Ray Data."""
