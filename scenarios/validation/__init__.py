"""Validation against published measurements: the tables, calibration provenance and statistics."""
