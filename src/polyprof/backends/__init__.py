"""polyprof's built-in backends. They register through entry points like any plugin; the engine
never imports them by name."""
