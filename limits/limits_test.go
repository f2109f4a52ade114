package limits

import (
	"math"
	"reflect"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

var fields = []string{"cpus", "memory", "pids"}

// checkFieldError checks that err names field, and no other field: callers
// find the setting to blame by the field name in the message.
func checkFieldError(t *testing.T, what string, err error, field string, values ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s succeeded, want an error about %s", what, field)
		return
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, field+" ") {
		t.Errorf("%s error %q does not start with the field %q", what, msg, field)
	}
	for _, f := range fields {
		if f != field && strings.Contains(msg, f) {
			t.Errorf("%s error %q mentions %q, but is about %q", what, msg, f, field)
		}
	}
	for _, v := range values {
		if !strings.Contains(msg, v) {
			t.Errorf("%s error %q does not mention %q", what, msg, v)
		}
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		l        Limits
		hostCPUs int
	}{
		{Limits{CPUs: 1, Memory: 1 << 30, Pids: 512}, 4},
		{Limits{CPUs: 4, Memory: 1 << 30, Pids: 512}, 4},
		{Limits{CPUs: 0.01, Memory: 6 << 20, Pids: 8}, 1},
		{Limits{CPUs: 1.5, Memory: math.MaxInt64, Pids: MaxPids}, 2},
		{Limits{CPUs: 64, Memory: 1 << 30, Pids: 512}, 0}, // host CPUs unknown
	}
	for _, tt := range tests {
		if err := tt.l.Validate(tt.hostCPUs); err != nil {
			t.Errorf("%+v.Validate(%d) error: %v", tt.l, tt.hostCPUs, err)
		}
	}
}

func TestValidateErrors(t *testing.T) {
	ok := Limits{CPUs: 1, Memory: 1 << 30, Pids: 512}
	tests := []struct {
		name     string
		l        Limits
		hostCPUs int
		field    string
		values   []string
	}{
		{"zero cpus", Limits{Memory: 1 << 30, Pids: 512}, 4, "cpus", []string{"cpus 0 ", "0.01"}},
		{"negative cpus", Limits{CPUs: -1, Memory: 1 << 30, Pids: 512}, 4, "cpus", []string{"-1", "0.01"}},
		{"tiny cpus", Limits{CPUs: 0.001, Memory: 1 << 30, Pids: 512}, 4, "cpus", []string{"0.001", "0.01"}},
		{"NaN cpus", Limits{CPUs: math.NaN(), Memory: 1 << 30, Pids: 512}, 4, "cpus", []string{"NaN"}},
		{"Inf cpus", Limits{CPUs: math.Inf(1), Memory: 1 << 30, Pids: 512}, 0, "cpus", []string{"+Inf", "too large"}},
		{"cpus above host", Limits{CPUs: 4.5, Memory: 1 << 30, Pids: 512}, 4, "cpus", []string{"4.5", "the host has 4 CPUs"}},
		{"cpus above one-CPU host", Limits{CPUs: 2, Memory: 1 << 30, Pids: 512}, 1, "cpus", []string{"cpus 2 ", "the host has 1 CPU"}},
		{"zero memory", Limits{CPUs: 1, Pids: 512}, 4, "memory", []string{"memory 0 ", "greater than 0"}},
		{"negative memory", Limits{CPUs: 1, Memory: -1 << 20, Pids: 512}, 4, "memory", []string{"-1MiB"}},
		{"memory below Docker's minimum", Limits{CPUs: 1, Memory: 4 << 20, Pids: 512}, 4, "memory", []string{"4MiB", "Docker's minimum of 6MiB"}},
		{"memory just below minimum", Limits{CPUs: 1, Memory: 6<<20 - 1, Pids: 512}, 4, "memory", []string{"6291455", "6MiB"}},
		{"zero pids", Limits{CPUs: 1, Memory: 1 << 30}, 4, "pids", []string{"pids 0 ", "minimum of 8"}},
		{"negative pids", Limits{CPUs: 1, Memory: 1 << 30, Pids: -1}, 4, "pids", []string{"pids -1 ", "minimum of 8"}},
		{"pids below minimum", Limits{CPUs: 1, Memory: 1 << 30, Pids: 7}, 4, "pids", []string{"pids 7 ", "minimum of 8"}},
		{"pids above the kernel's maximum", Limits{CPUs: 1, Memory: 1 << 30, Pids: MaxPids + 1}, 4, "pids", []string{"pids 4194305 ", "kernel's maximum of 4194304"}},
		{"pids far above the kernel's maximum", Limits{CPUs: 1, Memory: 1 << 30, Pids: math.MaxInt64}, 4, "pids", []string{"9223372036854775807", "4194304"}},
		{"zero value", Limits{}, 4, "cpus", nil},
	}
	if err := ok.Validate(4); err != nil {
		t.Fatalf("%+v.Validate(4) error: %v", ok, err)
	}
	for _, tt := range tests {
		checkFieldError(t, tt.name, tt.l.Validate(tt.hostCPUs), tt.field, tt.values...)
	}
}

func TestWithin(t *testing.T) {
	max := Limits{CPUs: 2, Memory: 4 << 30, Pids: 1024}
	for _, l := range []Limits{
		max,
		{CPUs: 0.5, Memory: 1 << 30, Pids: 64},
		{}, // nothing asked for
	} {
		if err := l.Within(max); err != nil {
			t.Errorf("%+v.Within(%+v) error: %v", l, max, err)
		}
	}
}

func TestWithinErrors(t *testing.T) {
	max := Limits{CPUs: 2, Memory: 4 << 30, Pids: 1024}
	tests := []struct {
		name   string
		l      Limits
		field  string
		values []string
	}{
		{"cpus", Limits{CPUs: 2.5, Memory: 1 << 30, Pids: 64}, "cpus", []string{"cpus 2.5 ", "maximum of 2"}},
		{"memory", Limits{CPUs: 1, Memory: 8 << 30, Pids: 64}, "memory", []string{"memory 8GiB ", "maximum of 4GiB"}},
		{"memory by a byte", Limits{CPUs: 1, Memory: 4<<30 + 1, Pids: 64}, "memory", []string{"4294967297", "maximum of 4GiB"}},
		{"pids", Limits{CPUs: 1, Memory: 1 << 30, Pids: 2048}, "pids", []string{"pids 2048 ", "maximum of 1024"}},
		{"first field wins", Limits{CPUs: 3, Memory: 8 << 30, Pids: 2048}, "cpus", []string{"cpus 3 "}},
	}
	for _, tt := range tests {
		checkFieldError(t, tt.name, tt.l.Within(max), tt.field, tt.values...)
	}
}

func TestLinuxResources(t *testing.T) {
	i64 := func(v int64) *int64 { return &v }
	u64 := func(v uint64) *uint64 { return &v }
	tests := []struct {
		l    Limits
		want *specs.LinuxResources
	}{
		{Limits{}, &specs.LinuxResources{}},
		{
			Limits{CPUs: 1.5, Memory: 512 << 20, Pids: 256},
			&specs.LinuxResources{
				CPU:    &specs.LinuxCPU{Quota: i64(150000), Period: u64(100000)},
				Memory: &specs.LinuxMemory{Limit: i64(512 << 20), Swap: i64(512 << 20)},
				Pids:   &specs.LinuxPids{Limit: i64(256)},
			},
		},
		{
			Limits{CPUs: 0.01},
			&specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(1000), Period: u64(100000)}},
		},
		{
			// Rounded to the nearest microsecond of quota.
			Limits{CPUs: 0.123456},
			&specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(12346), Period: u64(100000)}},
		},
		{
			// Out of range, but kept from wrapping to a negative quota.
			Limits{CPUs: 1e300},
			&specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(math.MaxInt64), Period: u64(100000)}},
		},
		{
			Limits{Memory: 6 << 20},
			&specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(6 << 20), Swap: i64(6 << 20)}},
		},
		{
			Limits{Pids: 8},
			&specs.LinuxResources{Pids: &specs.LinuxPids{Limit: i64(8)}},
		},
	}
	for _, tt := range tests {
		got := tt.l.LinuxResources()
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%+v.LinuxResources() =\n%s\nwant\n%s", tt.l, dump(got), dump(tt.want))
		}
	}
}

// TestLinuxResourcesNotShared checks that the pointers LinuxResources hands
// out are its own, so that changing one leaves the other fields alone.
func TestLinuxResourcesNotShared(t *testing.T) {
	r := Limits{CPUs: 1, Memory: 1 << 30, Pids: 64}.LinuxResources()
	*r.Memory.Swap = -1
	if *r.Memory.Limit != 1<<30 {
		t.Errorf("setting swap changed the memory limit to %d", *r.Memory.Limit)
	}
}
