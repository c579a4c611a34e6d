"""Chrome trace JSON in Kineto's dialect: the writer (:mod:`.write`), the reference reader
(:mod:`.read`), the C scanner's reader (:mod:`.scan`) and what both readers agree on (:mod:`.dialect`)."""
