"""Python twins of the C extension's parts that users without it need: the recorder and the column
helpers it shares with the backends. :mod:`polyprof._native` chooses between them and C."""
