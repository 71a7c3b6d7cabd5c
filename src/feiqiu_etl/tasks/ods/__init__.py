"""ODS loading: task specs, request building, record processing and the ODS write path."""
