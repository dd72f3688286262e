"""The change history of a mirrored table: a Delta log of every applied change (table, write)."""
