"""What every format shares: limits on what is read (:mod:`.source`), values as the files hold them
(:mod:`.values`), the one way a reader finishes a Trace (:mod:`.finish`), JSON-safe values
(:mod:`.jsonsafe`) and output paths (:mod:`.paths`)."""
