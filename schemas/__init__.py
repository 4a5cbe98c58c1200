"""The versioned JSON Schema files of the specfmt format (installed as ``specfmt.schemas``).

``config-v1.schema.json``: the config.json of a speculator, format v1.
"""
