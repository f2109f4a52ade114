package limits

import (
	"math"
	"strings"
	"testing"
)

func TestParseCPUs(t *testing.T) {
	tests := []struct {
		in   string
		want float64
	}{
		{"1", 1},
		{"2", 2},
		{"1.5", 1.5},
		{"0.25", 0.25},
		{"0.01", 0.01},
		{"0.0125", 0.0125},
		{"  3 ", 3},
		{"64", 64},
	}
	for _, tt := range tests {
		got, err := ParseCPUs(tt.in)
		if err != nil {
			t.Errorf("ParseCPUs(%q) error: %v", tt.in, err)
			continue
		}
		if got != tt.want {
			t.Errorf("ParseCPUs(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestParseCPUsErrors(t *testing.T) {
	tests := []struct {
		in   string
		want string // in the message
	}{
		{"", "empty"},
		{"   ", "empty"},
		{"0", "at least 0.01"},
		{"0.0", "at least 0.01"},
		{"0.009", "at least 0.01"},
		{"-1", "at least 0.01"},
		{"-0.5", "at least 0.01"},
		{"abc", "decimal number"},
		{"NaN", "decimal number"},
		{"Inf", "decimal number"},
		{"+Inf", "decimal number"},
		{"+1", "decimal number"},
		{"1e3", "decimal number"},
		{"0x1p-2", "decimal number"},
		{"1_000", "decimal number"},
		{"1.", "decimal number"},
		{".5", "decimal number"},
		{"1.2.3", "decimal number"},
		{"2 cpus", "decimal number"},
		{"10000000000", "too large"},
		{"1" + strings.Repeat("0", 40), "too large"},
	}
	for _, tt := range tests {
		_, err := ParseCPUs(tt.in)
		if err == nil {
			t.Errorf("ParseCPUs(%q) succeeded, want error", tt.in)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseCPUs(%q) error %q does not mention %q", tt.in, err, tt.want)
		}
		if tt.in != "" && strings.TrimSpace(tt.in) != "" && !strings.Contains(err.Error(), tt.in) {
			t.Errorf("ParseCPUs(%q) error %q does not quote the value", tt.in, err)
		}
	}
}

func TestParsePids(t *testing.T) {
	tests := []struct {
		in   string
		want int64
	}{
		{"0", 0},
		{"8", 8},
		{"512", 512},
		{" 1024 ", 1024},
		{"9223372036854775807", math.MaxInt64},
	}
	for _, tt := range tests {
		got, err := ParsePids(tt.in)
		if err != nil {
			t.Errorf("ParsePids(%q) error: %v", tt.in, err)
			continue
		}
		if got != tt.want {
			t.Errorf("ParsePids(%q) = %d, want %d", tt.in, got, tt.want)
		}
	}
}

func TestParsePidsErrors(t *testing.T) {
	tests := []struct {
		in   string
		want string
	}{
		{"", "empty"},
		{"-1", "negative"},
		{"abc", "whole number"},
		{"1.5", "whole number"},
		{"+5", "whole number"},
		{"1e3", "whole number"},
		{"9223372036854775808", "more than 9223372036854775807"},
	}
	for _, tt := range tests {
		_, err := ParsePids(tt.in)
		if err == nil {
			t.Errorf("ParsePids(%q) succeeded, want error", tt.in)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParsePids(%q) error %q does not mention %q", tt.in, err, tt.want)
		}
		if tt.in != "" && !strings.Contains(err.Error(), tt.in) {
			t.Errorf("ParsePids(%q) error %q does not quote the value", tt.in, err)
		}
	}
}

func TestParseBytes(t *testing.T) {
	const (
		k = 1 << 10
		m = 1 << 20
		g = 1 << 30
	)
	tests := []struct {
		in   string
		want int64
	}{
		{"0", 0},
		{"1024", 1024},
		{"100b", 100},
		{"100B", 100},
		{"64k", 64 * k},
		{"64K", 64 * k},
		{"64ki", 64 * k},
		{"64KiB", 64 * k},
		{"64kb", 64 * k},
		{"64KB", 64 * k},
		{"512m", 512 * m},
		{"512M", 512 * m},
		{"512MiB", 512 * m},
		{"512mib", 512 * m},
		{"512mb", 512 * m},
		{"512MB", 512 * m},
		{"2g", 2 * g},
		{"2G", 2 * g},
		{"2GiB", 2 * g},
		{"2gb", 2 * g},
		{"1t", 1 << 40},
		{"1TiB", 1 << 40},
		{"1tb", 1 << 40},
		{"1p", 1 << 50},
		{"1PiB", 1 << 50},
		{"1.5GiB", 3 * g / 2},
		{"1.5g", 3 * g / 2},
		{"0.5k", 512},
		{"1.1k", 1126}, // 1126.4: the fraction of a byte is dropped
		{"512 MiB", 512 * m},
		{"512  m", 512 * m},
		{" 2g ", 2 * g},
		{"007m", 7 * m},
		{"8191p", 8191 << 50},
		{"9223372036854775807", math.MaxInt64},
		{"0.9999999999999999999999k", 1023},
	}
	for _, tt := range tests {
		got, err := ParseBytes(tt.in)
		if err != nil {
			t.Errorf("ParseBytes(%q) error: %v", tt.in, err)
			continue
		}
		if got != tt.want {
			t.Errorf("ParseBytes(%q) = %d, want %d", tt.in, got, tt.want)
		}
	}
}

func TestParseBytesErrors(t *testing.T) {
	tests := []struct {
		in   string
		want string
	}{
		{"", "empty"},
		{" ", "empty"},
		{"-5m", "negative"},
		{"-1", "negative"},
		{"5x", `unknown unit "x"`},
		{"5 x", `unknown unit "x"`},
		{"1e3", `unknown unit "e3"`},
		{"5kk", `unknown unit "kk"`},
		{"5mbi", `unknown unit "mbi"`},
		{"5e", `unknown unit "e"`}, // exbibytes would overflow all but the smallest counts
		{"m", "want a number"},
		{"abc", "want a number"},
		{"+5m", "want a number"},
		{".5m", "want a number"},
		{"5.m", "want a number"},
		{"1.2.3m", "want a number"},
		{"NaN", "want a number"},
		{"9223372036854775808", "more than the largest size"},
		{"8192p", "more than the largest size"},
		{"8t" + strings.Repeat("0", 10), `unknown unit`},
		{"1" + strings.Repeat("0", 40) + "k", "more than the largest size"},
	}
	for _, tt := range tests {
		_, err := ParseBytes(tt.in)
		if err == nil {
			t.Errorf("ParseBytes(%q) succeeded, want error", tt.in)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseBytes(%q) error %q does not mention %q", tt.in, err, tt.want)
		}
		if strings.TrimSpace(tt.in) != "" && !strings.Contains(err.Error(), tt.in) {
			t.Errorf("ParseBytes(%q) error %q does not quote the value", tt.in, err)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	tests := []struct {
		in   int64
		want string
	}{
		{0, "0"},
		{100, "100"},
		{1023, "1023"},
		{1024, "1KiB"},
		{1536, "1536"},
		{6 << 20, "6MiB"},
		{512 << 20, "512MiB"},
		{1 << 30, "1GiB"},
		{3 << 29, "1536MiB"},
		{1 << 40, "1TiB"},
		{1 << 50, "1PiB"},
		{1 << 62, "4096PiB"},
		{math.MaxInt64, "9223372036854775807"},
		{-1 << 20, "-1MiB"},
		{math.MinInt64, "-8192PiB"},
	}
	for _, tt := range tests {
		if got := FormatBytes(tt.in); got != tt.want {
			t.Errorf("FormatBytes(%d) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestFormatBytesRoundTrip checks that what FormatBytes writes, for messages
// and docs, reads back to the same value.
func TestFormatBytesRoundTrip(t *testing.T) {
	for _, n := range []int64{0, 1, 100, 1024, 1536, 6 << 20, 3 << 29, 1 << 40, 5 << 50, 1 << 62, math.MaxInt64} {
		s := FormatBytes(n)
		got, err := ParseBytes(s)
		if err != nil {
			t.Errorf("ParseBytes(FormatBytes(%d) = %q) error: %v", n, s, err)
			continue
		}
		if got != n {
			t.Errorf("ParseBytes(FormatBytes(%d) = %q) = %d", n, s, got)
		}
	}
}

// TestParseLongInput: a peer may send megabytes of digits; they are refused
// by their length, before any arithmetic on them.
func TestParseLongInput(t *testing.T) {
	long := strings.Repeat("9", 1<<20)
	parsers := []struct {
		name  string
		parse func(string) error
	}{
		{"ParseBytes", func(s string) error { _, err := ParseBytes(s); return err }},
		{"ParseCPUs", func(s string) error { _, err := ParseCPUs(s); return err }},
		{"ParsePids", func(s string) error { _, err := ParsePids(s); return err }},
	}
	for _, p := range parsers {
		for _, in := range []string{long, "1." + long, strings.Repeat("0", 65) + "1"} {
			err := p.parse(in)
			if err == nil || !strings.Contains(err.Error(), "longer than 64 characters") || len(err.Error()) > 200 {
				t.Errorf("%s(%.10q... %d bytes) = %.200v, want a short error about its length", p.name, in, len(in), err)
			}
		}
	}
}

func TestLimitsSet(t *testing.T) {
	tests := []struct {
		field, value string
		want         Limits
		wantErr      string
	}{
		{"cpus", "1.5", Limits{CPUs: 1.5}, ""},
		{"memory", "512MiB", Limits{Memory: 512 << 20}, ""},
		{"pids", "64", Limits{Pids: 64}, ""},
		{"pids", "0", Limits{}, "at least 8"},
		{"memory", "0", Limits{}, "at least 6MiB"},
		{"memory", "0.5", Limits{}, "at least 6MiB"},
		{"cpus", "0", Limits{}, "at least 0.01"},
		{"pids", "-1", Limits{}, "negative"},
		{"disk", "1g", Limits{}, "unknown limit"},
	}
	for _, tc := range tests {
		var l Limits
		err := l.Set(tc.field, tc.value)
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("Set(%q, %q) = %v, want error containing %q", tc.field, tc.value, err, tc.wantErr)
		}
		if l != tc.want {
			t.Errorf("Set(%q, %q) gave %+v, want %+v", tc.field, tc.value, l, tc.want)
		}
	}
}
