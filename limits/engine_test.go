package limits

import (
	"encoding/json"
	"math"
	"reflect"
	"testing"

	"github.com/moby/moby/api/types/container"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func dump(v any) string {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err.Error()
	}
	return string(b)
}

func TestEngineResources(t *testing.T) {
	i64 := func(v int64) *int64 { return &v }
	u64 := func(v uint64) *uint64 { return &v }
	u16 := func(v uint16) *uint16 { return &v }
	yes := func() *bool { v := true; return &v }
	tests := []struct {
		name string
		in   *specs.LinuxResources
		want container.Resources
	}{
		{"nil", nil, container.Resources{}},
		{"empty", &specs.LinuxResources{}, container.Resources{}},
		{
			"empty sections",
			&specs.LinuxResources{
				CPU:     &specs.LinuxCPU{},
				Memory:  &specs.LinuxMemory{},
				Pids:    &specs.LinuxPids{},
				BlockIO: &specs.LinuxBlockIO{},
			},
			container.Resources{},
		},
		{
			"quota over the default period",
			&specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(150000), Period: u64(100000)}},
			container.Resources{NanoCPUs: 1_500_000_000},
		},
		{
			"quota without a period uses the kernel's 100ms",
			&specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(50000)}},
			container.Resources{NanoCPUs: 500_000_000},
		},
		{
			"quota over a zero period uses the kernel's 100ms",
			&specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(50000), Period: u64(0)}},
			container.Resources{NanoCPUs: 500_000_000},
		},
		{
			"quota over another period keeps the share of a CPU",
			&specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(75000), Period: u64(50000)}},
			container.Resources{NanoCPUs: 1_500_000_000},
		},
		{
			"rounded to the nearest nano CPU",
			&specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(2), Period: u64(3)}},
			container.Resources{NanoCPUs: 666_666_667},
		},
		{
			"rounded down below a half",
			&specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(1), Period: u64(3)}},
			container.Resources{NanoCPUs: 333_333_333},
		},
		{
			"unlimited quota",
			&specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(-1), Period: u64(100000)}},
			container.Resources{},
		},
		{
			"zero quota",
			&specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(0)}},
			container.Resources{},
		},
		{
			"huge quota does not overflow",
			&specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(math.MaxInt64), Period: u64(100000)}},
			container.Resources{NanoCPUs: math.MaxInt64},
		},
		{
			"quota just within int64 nano CPUs",
			&specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(math.MaxInt64 / 1_000_000_000), Period: u64(1)}},
			container.Resources{NanoCPUs: math.MaxInt64 / 1_000_000_000 * 1_000_000_000},
		},
		{
			"quota beyond int64 nano CPUs",
			&specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(math.MaxInt64/1_000_000_000 + 1), Period: u64(1)}},
			container.Resources{NanoCPUs: math.MaxInt64},
		},
		{
			"everything that maps",
			&specs.LinuxResources{
				CPU: &specs.LinuxCPU{
					Shares:          u64(512),
					Quota:           i64(200000),
					Period:          u64(100000),
					RealtimeRuntime: i64(950000),
					RealtimePeriod:  u64(1000000),
					Cpus:            "0-2",
					Mems:            "0",
				},
				Memory: &specs.LinuxMemory{
					Limit:            i64(1 << 30),
					Swap:             i64(2 << 30),
					Reservation:      i64(512 << 20),
					Swappiness:       u64(60),
					DisableOOMKiller: yes(),
				},
				Pids:    &specs.LinuxPids{Limit: i64(100)},
				BlockIO: &specs.LinuxBlockIO{Weight: u16(300)},
			},
			container.Resources{
				CPUShares:          512,
				NanoCPUs:           2_000_000_000,
				CPURealtimeRuntime: 950000,
				CPURealtimePeriod:  1000000,
				CpusetCpus:         "0-2",
				CpusetMems:         "0",
				Memory:             1 << 30,
				MemorySwap:         2 << 30,
				MemoryReservation:  512 << 20,
				MemorySwappiness:   i64(60),
				OomKillDisable:     yes(),
				PidsLimit:          i64(100),
				BlkioWeight:        300,
			},
		},
		{
			"unlimited swap",
			&specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(1 << 30), Swap: i64(-1)}},
			container.Resources{Memory: 1 << 30, MemorySwap: -1},
		},
		{
			"a negative memory limit or reservation is runtime-spec's no limit, which the Engine would refuse",
			&specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(-1), Reservation: i64(-1), Swap: i64(-1)}},
			container.Resources{MemorySwap: -1},
		},
		{
			"out-of-range unsigned values are clamped",
			&specs.LinuxResources{
				CPU:    &specs.LinuxCPU{Shares: u64(math.MaxUint64), RealtimePeriod: u64(math.MaxUint64)},
				Memory: &specs.LinuxMemory{Swappiness: u64(math.MaxUint64)},
			},
			container.Resources{
				CPUShares:         math.MaxInt64,
				CPURealtimePeriod: math.MaxInt64,
				MemorySwappiness:  i64(math.MaxInt64),
			},
		},
		{
			"what has no Engine counterpart is left out",
			&specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
				CPU:     &specs.LinuxCPU{Burst: u64(1000), Idle: i64(1)},
				Memory:  &specs.LinuxMemory{KernelTCP: i64(1 << 20)},
				BlockIO: &specs.LinuxBlockIO{
					LeafWeight:            u16(10),
					WeightDevice:          []specs.LinuxWeightDevice{{LinuxBlockIODevice: specs.LinuxBlockIODevice{Major: 8}, Weight: u16(10)}},
					ThrottleReadBpsDevice: []specs.LinuxThrottleDevice{{LinuxBlockIODevice: specs.LinuxBlockIODevice{Major: 8}, Rate: 1}},
				},
				HugepageLimits: []specs.LinuxHugepageLimit{{Pagesize: "2MB", Limit: 1 << 30}},
				Unified:        map[string]string{"memory.high": "1G"},
			},
			container.Resources{},
		},
	}
	for _, tt := range tests {
		got := EngineResources(tt.in)
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: EngineResources =\n%s\nwant\n%s", tt.name, dump(got), dump(tt.want))
		}
	}
}

// TestEngineResourcesNotShared checks that the result does not point into
// its argument, so that a caller may change one without the other.
func TestEngineResourcesNotShared(t *testing.T) {
	pids, swappiness, oom := int64(100), uint64(60), true
	r := &specs.LinuxResources{
		Pids:   &specs.LinuxPids{Limit: &pids},
		Memory: &specs.LinuxMemory{Swappiness: &swappiness, DisableOOMKiller: &oom},
	}
	got := EngineResources(r)
	*got.PidsLimit = 1
	*got.MemorySwappiness = 1
	*got.OomKillDisable = false
	if pids != 100 || swappiness != 60 || !oom {
		t.Errorf("changing the result changed the argument: pids %d, swappiness %d, oom kill disabled %v", pids, swappiness, oom)
	}
}

// TestEngineRoundTrip carries limits through runtime-spec to the Engine and
// checks that the Engine gets what was asked for.
func TestEngineRoundTrip(t *testing.T) {
	tests := []struct {
		l    Limits
		nano int64
	}{
		{Limits{CPUs: 1, Memory: 1 << 30, Pids: 512}, 1_000_000_000},
		{Limits{CPUs: 1.5, Memory: 512 << 20, Pids: 64}, 1_500_000_000},
		{Limits{CPUs: 0.25, Memory: 6 << 20, Pids: 8}, 250_000_000},
		{Limits{CPUs: 0.01, Memory: 3 << 29, Pids: 8}, 10_000_000},
		{Limits{CPUs: 0.0125, Memory: 100 << 20, Pids: 8}, 12_500_000},
		{Limits{CPUs: 64, Memory: 1 << 40, Pids: 1 << 22}, 64_000_000_000},
	}
	for _, tt := range tests {
		want := container.Resources{
			NanoCPUs:   tt.nano,
			Memory:     tt.l.Memory,
			MemorySwap: tt.l.Memory, // no swap beyond the limit
			PidsLimit:  &tt.l.Pids,
		}
		got := EngineResources(tt.l.LinuxResources())
		if !reflect.DeepEqual(got, want) {
			t.Errorf("EngineResources(%+v.LinuxResources()) =\n%s\nwant\n%s", tt.l, dump(got), dump(want))
		}
		if e := tt.l.Engine(); !reflect.DeepEqual(e, got) {
			t.Errorf("%+v.Engine() =\n%s\nwant\n%s", tt.l, dump(e), dump(got))
		}
	}
}

// TestEngineRoundTripParsed starts from the strings a person writes.
func TestEngineRoundTripParsed(t *testing.T) {
	cpus, err := ParseCPUs("1.5")
	if err != nil {
		t.Fatal(err)
	}
	mem, err := ParseBytes("1.5GiB")
	if err != nil {
		t.Fatal(err)
	}
	pids, err := ParsePids("256")
	if err != nil {
		t.Fatal(err)
	}
	l := Limits{CPUs: cpus, Memory: mem, Pids: pids}
	if err := l.Validate(2); err != nil {
		t.Fatal(err)
	}
	got := l.Engine()
	if got.NanoCPUs != 1_500_000_000 || got.Memory != 3<<29 || got.MemorySwap != 3<<29 || got.PidsLimit == nil || *got.PidsLimit != 256 {
		t.Errorf("Engine() = %s", dump(got))
	}
}
