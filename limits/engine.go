package limits

import (
	"math"
	"math/bits"

	"github.com/moby/moby/api/types/container"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Engine returns l as the Docker Engine's container resources.
func (l Limits) Engine() container.Resources {
	return EngineResources(l.LinuxResources())
}

// EngineResources maps runtime-spec resources to the Docker Engine's
// container resources. Fields that are not set in r are left zero, which the
// Engine reads as "no limit" or "default".
//
// A CFS quota becomes NanoCPUs, the Engine's form of --cpus, rather than
// CPUQuota and CPUPeriod: the Engine refuses both forms together, and
// NanoCPUs keeps the share of a CPU while letting the Engine pick its 100ms
// period. A negative quota, which runtime-spec uses for "no limit", sets
// nothing.
//
// Memory swap is the total of memory and swap in both APIs, so it is copied
// as is: swap equal to the limit means no swap beyond it.
//
// Some resources have no faithful counterpart and are left out:
//   - Devices: the Engine only takes allow rules, added to its own defaults,
//     so a runtime-spec list that denies could only be carried over by
//     granting more than it says; leaving it out grants less.
//   - Per-device block IO weights and throttles: runtime-spec names devices
//     by major:minor, the Engine by path on its host.
//   - CPU burst and idle, block IO leaf weight, kernel memory, hugepages,
//     network classes and priorities, RDMA and cgroup v2 unified keys: the
//     Engine's Resources has no field for them.
func EngineResources(r *specs.LinuxResources) container.Resources {
	var out container.Resources
	if r == nil {
		return out
	}
	if c := r.CPU; c != nil {
		if c.Quota != nil && *c.Quota > 0 {
			period := uint64(cpuPeriod)
			if c.Period != nil && *c.Period > 0 {
				period = *c.Period
			}
			out.NanoCPUs = nanoCPUs(*c.Quota, period)
		}
		if c.Shares != nil {
			out.CPUShares = clampInt64(*c.Shares)
		}
		if c.RealtimePeriod != nil {
			out.CPURealtimePeriod = clampInt64(*c.RealtimePeriod)
		}
		if c.RealtimeRuntime != nil {
			out.CPURealtimeRuntime = *c.RealtimeRuntime
		}
		out.CpusetCpus = c.Cpus
		out.CpusetMems = c.Mems
	}
	if m := r.Memory; m != nil {
		// runtime-spec writes "no limit" as -1, the Engine as 0 (and it
		// refuses a negative memory limit); swap keeps -1, which both read
		// as unlimited.
		if m.Limit != nil && *m.Limit > 0 {
			out.Memory = *m.Limit
		}
		if m.Swap != nil {
			out.MemorySwap = *m.Swap
		}
		if m.Reservation != nil && *m.Reservation > 0 {
			out.MemoryReservation = *m.Reservation
		}
		if m.Swappiness != nil {
			v := clampInt64(*m.Swappiness)
			out.MemorySwappiness = &v
		}
		if m.DisableOOMKiller != nil {
			v := *m.DisableOOMKiller
			out.OomKillDisable = &v
		}
	}
	if p := r.Pids; p != nil && p.Limit != nil {
		// A copy, so that the result does not share memory with r.
		v := *p.Limit
		out.PidsLimit = &v
	}
	if b := r.BlockIO; b != nil && b.Weight != nil {
		out.BlkioWeight = *b.Weight
	}
	return out
}

// nanoCPUs converts a CFS quota and period, both in microseconds, to
// billionths of a CPU, rounding to the nearest. The product is formed in 128
// bits because quota × 1e9 overflows an int64 for quotas above about 9.2e9.
func nanoCPUs(quota int64, period uint64) int64 {
	hi, lo := bits.Mul64(uint64(quota), 1e9)
	if hi >= period {
		return math.MaxInt64
	}
	q, rem := bits.Div64(hi, lo, period)
	if rem >= period-rem && q < math.MaxUint64 {
		q++
	}
	return clampInt64(q)
}

func clampInt64(v uint64) int64 {
	if v > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(v)
}
