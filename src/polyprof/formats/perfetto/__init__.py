"""Perfetto's protobuf trace format: the writer (:mod:`.write`), the slice order and lanes it needs
(:mod:`.order`), the wire format (:mod:`.wire`), the proto field numbers (:mod:`.fields`), the reference
reader (:mod:`.read`) and the C packet scanner's reader (:mod:`.scan`)."""
