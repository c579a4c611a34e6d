"""Helpers for backends whose vendor hands over buffers of activity records (CUPTI, PTI and the like):
finding the records in a buffer, names as integer codes into a string table, and kernel names as
Kineto writes them.

::

    from polyprof.plugin.records import code_strings, demangled, walk_tagged_records

    offsets = walk_tagged_records(buffer, valid, sizes, next_record)   # in C, one size per record kind
    names = demangled(code_strings(raw_names))                         # CodedStrings, demangled once each
"""

from polyprof.model.args import sorted_unique
from polyprof.model.strings import code_strings
from polyprof.plugin.symbols import demangle, demangled, demangler_problem
from polyprof.plugin.tagged_records import walk_tagged_records

__all__ = ["code_strings", "demangle", "demangled", "demangler_problem", "sorted_unique", "walk_tagged_records"]
