"""Example 3: page views per minute of event time, late records counted apart, to Parquet files."""
