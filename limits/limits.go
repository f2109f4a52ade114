package limits

import (
	"fmt"
	"math"
	"strconv"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

const (
	// cpuPeriod is the CFS period, in microseconds, that a CPU count is
	// expressed against. It is the kernel's default and the period Docker
	// uses for --cpus, so a quota reads as CPUs × 100ms.
	cpuPeriod = 100000

	// minMemory is the smallest memory limit the Docker Engine accepts
	// (linuxMinMemory in the daemon); checking it here reports the problem
	// against the setting instead of as a failed container create.
	minMemory = 6 << 20

	// minPids leaves room for an init process, a shell and the command it
	// runs. Fewer makes a container that cannot do anything, and zero or a
	// negative value would mean no limit at all to the Engine.
	minPids = 8
)

// MaxPids is the largest pids limit the kernel takes (PID_MAX_LIMIT, 2^22
// on 64-bit machines): pids.max refuses more, and the Engine with it, at
// every container start.
const MaxPids = 1 << 22

// Limits are the resource limits of one container. A zero field means the
// field is not set: LinuxResources leaves it out, and Validate rejects it.
type Limits struct {
	CPUs   float64 // CPUs the container may use, e.g. 1.5
	Memory int64   // memory limit in bytes; swap is not granted on top
	Pids   int64   // most processes and threads the container may hold
}

// Validate reports the first field that is out of range, naming the field
// ("cpus", "memory" or "pids") and its value. hostCPUs is the number of CPUs
// of the host the container runs on; below 1 it is taken as unknown and the
// CPU count is not checked against it.
func (l Limits) Validate(hostCPUs int) error {
	switch {
	case !(l.CPUs >= minCPUs): // written this way to catch NaN too
		return fmt.Errorf("cpus %s must be at least %v", formatCPUs(l.CPUs), minCPUs)
	case l.CPUs > maxCPUs:
		return fmt.Errorf("cpus %s is too large", formatCPUs(l.CPUs))
	case hostCPUs > 0 && l.CPUs > float64(hostCPUs):
		return fmt.Errorf("cpus %s is too many: the host has %s", formatCPUs(l.CPUs), plural(hostCPUs, "CPU"))
	case l.Memory <= 0:
		return fmt.Errorf("memory %s must be greater than 0", FormatBytes(l.Memory))
	case l.Memory < minMemory:
		return fmt.Errorf("memory %s is below Docker's minimum of %s", FormatBytes(l.Memory), FormatBytes(minMemory))
	case l.Pids < minPids:
		return fmt.Errorf("pids %d is below the minimum of %d", l.Pids, minPids)
	case l.Pids > MaxPids:
		return fmt.Errorf("pids %d is above the kernel's maximum of %d", l.Pids, MaxPids)
	}
	return nil
}

// Within reports the first field of l that is above the same field of max,
// naming the field, the requested value and the maximum. It is how an
// override asked for by a client is held to the configured maximum.
func (l Limits) Within(max Limits) error {
	switch {
	case l.CPUs > max.CPUs:
		return fmt.Errorf("cpus %s is above the maximum of %s", formatCPUs(l.CPUs), formatCPUs(max.CPUs))
	case l.Memory > max.Memory:
		return fmt.Errorf("memory %s is above the maximum of %s", FormatBytes(l.Memory), FormatBytes(max.Memory))
	case l.Pids > max.Pids:
		return fmt.Errorf("pids %d is above the maximum of %d", l.Pids, max.Pids)
	}
	return nil
}

// LinuxResources expresses l in runtime-spec terms: a CFS quota over a
// 100ms period, a memory limit with swap equal to it (the total of memory and
// swap, so no swap beyond the limit), and a pids limit. Fields that are zero
// are left out.
func (l Limits) LinuxResources() *specs.LinuxResources {
	r := &specs.LinuxResources{}
	if l.CPUs > 0 {
		period := uint64(cpuPeriod)
		quota := cpuQuota(l.CPUs)
		r.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	}
	if l.Memory > 0 {
		limit, swap := l.Memory, l.Memory
		r.Memory = &specs.LinuxMemory{Limit: &limit, Swap: &swap}
	}
	if l.Pids > 0 {
		pids := l.Pids
		r.Pids = &specs.LinuxPids{Limit: &pids}
	}
	return r
}

// cpuQuota converts a CPU count to a quota per cpuPeriod. Out-of-range counts
// are for Validate to reject; here they are only kept from wrapping.
func cpuQuota(cpus float64) int64 {
	q := math.Round(cpus * cpuPeriod)
	if q >= math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

func formatCPUs(f float64) string {
	return strconv.FormatFloat(f, 'f', -1, 64)
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}
