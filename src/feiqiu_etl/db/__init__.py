"""PostgreSQL access: embedded server management, DSN resolution and schema DDL."""
