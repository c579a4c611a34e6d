"""The one way a fast path says "not this input": a C scanner, or a read in bounded memory, meets
something the reference reader reads differently (or names as a problem), or input it is not for (a
ring's spill with its older generation is loaded whole). The caller then takes the reference path::

    try:
        rank, rows = stream_rank(source, out)
    except Declined:
        ...                                   # load it whole: the reference reader says what is wrong
"""


class Declined(Exception):
    """A fast path leaves this input to the reference path; the message says why."""
