"""The mirror's table as Delta Lake: the log, its commits, deletion vectors."""
