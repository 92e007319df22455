# Reads `go test -bench` lines of BenchmarkCommit / BenchmarkCommitCluster (p50-us and
# p99-us metrics), passes them through, then prints each variant's p50 and p99 as a ratio
# to local SQLite with synchronous=FULL (BenchmarkCommit) or to the leader-local cluster
# run (BenchmarkCommitCluster), per workload. Usage: go test -bench ... | awk -f commit-ratio.awk
{ print }
/^Benchmark/ {
	name = $1
	sub(/-[0-9]+$/, "", name)          # GOMAXPROCS suffix
	n = split(name, part, "/")         # Benchmark, variant, workload
	if (n < 3) next
	v = part[2]; w = part[3]
	for (i = 2; i < NF; i++) {
		if ($(i + 1) == "p50-us") p50[v "/" w] = $i
		if ($(i + 1) == "p99-us") p99[v "/" w] = $i
	}
	variants[v] = 1; workloads[w] = 1
}
END {
	base = ("local-full" in variants) ? "local-full" : "leader-local"
	for (w in workloads) for (v in variants) {
		if (v == base || !((base "/" w) in p50) || p50[base "/" w] == 0 || p99[base "/" w] == 0) continue
		printf "ratio %s/%s vs %s: p50 %.2fx, p99 %.2fx\n", v, w, base, p50[v "/" w] / p50[base "/" w], p99[v "/" w] / p99[base "/" w]
	}
}
