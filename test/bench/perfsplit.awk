# perfsplit.awk splits a whole-system perf profile of two driver processes into
# CPU per cycle by category (test/bench/README.md, "Where the rest goes,
# whole-system"). Record while TestKubeletShapedProcess runs, with the driver
# built unstripped and the test binary kept (go test -c), so that both resolve:
#
#   perf record -a -g -F 4000 -o perf.data -- sleep 14
#   perf script -i perf.data --pid A,B -F pid,ip,sym > perf.txt
#   awk -v a=A -v b=B -v ca=CYCLES_A -v cb=CYCLES_B -v hz=4000 -f perfsplit.awk perf.txt
#
# CYCLES_A and CYCLES_B are each process's cycles during the recording (its
# cycles/s times its share of the recording's seconds). A sample is put in the
# first category its call chain matches, in the order below: a syscall by its
# name, the kernel's work on a syscall's way out, then the Go side.

function classify(chain,   c) {
	if (match(chain, / (__x64_sys_|__do_sys_)[a-z0-9_]+/)) {
		c = substr(chain, RSTART + 1, RLENGTH - 1)
		sub(/^(__x64_sys_|__do_sys_)/, "", c)
		return "sys " c
	}
	if (chain ~ / ksys_write/) return "sys write"
	if (chain ~ / ksys_read/) return "sys read"
	if (chain ~ / do_syscall_64/) return "syscall exit work"
	if (chain ~ /gcBgMarkWorker|gcAssistAlloc|bgsweep|bgscavenge|markroot/) return "go collector"
	if (chain ~ /go\.etcd\.io\/bbolt/) return "go bbolt"
	if (chain ~ /k8s\.io\/klog|go-logr/) return "go klog"
	if (chain ~ /encoding\/json/) return "go json"
	if (chain ~ /prometheus/) return "go metrics"
	if (chain ~ /Listener\)\.Accept|UnixListener/) return "go accept"
	if (chain ~ /ephemera\/(framework|api|drivers)/) return "go framework"
	if (chain ~ /grpc|http2|hpack|protobuf/) return "go grpc"
	if (chain ~ /runtime\.(mcall|schedule|findRunnable|park_m|goschedImpl|gopreempt|sysmon|mstart)/) return "go scheduler"
	if (chain ~ /asm_exc_page_fault/) return "page faults"
	if (chain ~ /irq/) return "interrupts"
	return "other"
}

function flush() {
	if (chain != "" && (pid == a || pid == b)) {
		n[pid, classify(chain)]++
		cat[classify(chain)] = 1
	}
	chain = ""
}

/^ *[0-9]+ *$/ { flush(); pid = $1; next }
{ chain = chain " " $2 }

END {
	flush()
	us = 1e6 / hz
	sorted = "sort -g -r | cut -f2-"
	printf "%-22s %10s %10s %10s\n", "us per cycle", a, b, "difference"
	for (c in cat) {
		x = n[a, c] * us / ca
		y = n[b, c] * us / cb
		ta += x
		tb += y
		printf "%f\t%-22s %10.1f %10.1f %+10.1f\n", x - y, c, x, y, x - y | sorted
	}
	close(sorted)
	printf "%-22s %10.1f %10.1f %+10.1f\n", "all", ta, tb, ta - tb
}
