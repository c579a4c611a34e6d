-- Each rank's collective operations, as the rank view counts them: c10d::, record_param_comms, gloo:
-- and nccl: ops and NCCL kernels ({COLLECTIVE} is polyprof.analysis.ranks.COLLECTIVE's pattern).
select rank, start_ns, end_ns from activities where regexp_matches(name, '{COLLECTIVE}')
