"""Tests of the PySpark data source lavinpy.spark (marker `spark`)."""
