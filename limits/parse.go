package limits

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// Set parses value into the named field of l: "cpus", "memory" or "pids",
// the names sandbox.toml, the command-line flags and
// _sandboxd/session/open share. A value that comes to zero is refused: a
// zero field means "not set", so "--pids 0" would otherwise quietly be the
// default (and is no limit at all to the Engine).
func (l *Limits) Set(field, value string) error {
	switch field {
	case "cpus":
		v, err := ParseCPUs(value)
		if err != nil {
			return err
		}
		l.CPUs = v
	case "memory":
		v, err := ParseBytes(value)
		if err != nil {
			return err
		}
		if v == 0 {
			return fmt.Errorf("invalid size %q: must be at least %s", value, FormatBytes(minMemory))
		}
		l.Memory = v
	case "pids":
		v, err := ParsePids(value)
		if err != nil {
			return err
		}
		if v == 0 {
			return fmt.Errorf("invalid pids limit %q: must be at least %d", value, minPids)
		}
		l.Pids = v
	default:
		return fmt.Errorf("unknown limit %q: want cpus, memory or pids", field)
	}
	return nil
}

// maxLen bounds what the parsers read: every valid value is far shorter,
// and exact arithmetic on a peer's megabyte of digits would take minutes.
const maxLen = 64

// tooLong reports an input past maxLen, quoting only its start.
func tooLong(what, s string) error {
	return fmt.Errorf("invalid %s %.20q...: longer than %d characters", what, s, maxLen)
}

// minCPUs is the smallest CPU count accepted. At the 100ms CFS period it is
// a 1ms quota, the least the kernel will take.
const minCPUs = 0.01

// maxCPUs keeps cpus × 1e9 within an int64, so that every parsed value can
// be handed to the Engine as NanoCPUs.
const maxCPUs = math.MaxInt64 / 1e9

// ParseCPUs parses a CPU count written as a plain decimal number, such as
// "1", "1.5" or "0.25". The count must be at least 0.01. Signs, exponents,
// hexadecimal, NaN and Inf are rejected: the value is written by people, and
// those forms are more likely mistakes than intent.
func ParseCPUs(s string) (float64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, errors.New("CPU count is empty")
	}
	if len(t) > maxLen {
		return 0, tooLong("CPU count", t)
	}
	if strings.HasPrefix(t, "-") && isDecimal(t[1:]) {
		return 0, fmt.Errorf("invalid CPU count %q: must be at least %v", s, minCPUs)
	}
	if !isDecimal(t) {
		return 0, fmt.Errorf("invalid CPU count %q: want a decimal number such as 1 or 1.5", s)
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f > maxCPUs {
		return 0, fmt.Errorf("invalid CPU count %q: too large", s)
	}
	if f < minCPUs {
		return 0, fmt.Errorf("invalid CPU count %q: must be at least %v", s, minCPUs)
	}
	return f, nil
}

// ParsePids parses a process count limit written as a decimal integer, such
// as "512". Zero is returned as is; whether it is acceptable is for
// Limits.Validate to say.
func ParsePids(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, errors.New("pids limit is empty")
	}
	if len(t) > maxLen {
		return 0, tooLong("pids limit", t)
	}
	if strings.HasPrefix(t, "-") && isDigits(t[1:]) {
		return 0, fmt.Errorf("invalid pids limit %q: must not be negative", s)
	}
	if !isDigits(t) {
		return 0, fmt.Errorf("invalid pids limit %q: want a whole number such as 512", s)
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid pids limit %q: more than %d", s, int64(math.MaxInt64))
	}
	return n, nil
}

// ParseBytes parses a size in bytes written as a number with an optional
// unit, such as "1024", "64k", "512MiB", "2g" or "1.5 GiB".
//
// Units are case-insensitive and may be separated from the number by
// spaces. k, m, g, t and p, with or without "i" and "b" ("KiB", "kb"), are
// all binary: powers of 1024, as Docker reads them. A fractional number is
// allowed; any fraction of a byte left over is dropped. "0" gives 0: whether
// zero is acceptable is for the caller to decide.
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, errors.New("size is empty")
	}
	if len(t) > maxLen {
		return 0, tooLong("size", t)
	}
	if strings.HasPrefix(t, "-") {
		return 0, fmt.Errorf("invalid size %q: must not be negative", s)
	}
	i := 0
	for i < len(t) && (isDigit(t[i]) || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	if !isDecimal(num) {
		return 0, fmt.Errorf("invalid size %q: want a number with an optional unit, such as 512MiB or 2g", s)
	}
	shift, ok := unitShift(unit)
	if !ok {
		return 0, fmt.Errorf("invalid size %q: unknown unit %q: use k, m, g, t or p (powers of 1024), optionally followed by iB or B", s, strings.TrimSpace(t[i:]))
	}
	// Exact integer arithmetic, so that "1.5GiB" is exactly 1610612736 and an
	// overflow is reported instead of wrapping: digits × 2^shift / 10^len(frac).
	whole, frac, _ := strings.Cut(num, ".")
	n, _ := new(big.Int).SetString(whole+frac, 10)
	n.Lsh(n, shift)
	n.Quo(n, new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(len(frac))), nil))
	if !n.IsInt64() {
		return 0, fmt.Errorf("invalid size %q: more than the largest size, %d bytes", s, int64(math.MaxInt64))
	}
	return n.Int64(), nil
}

// unitShift gives the power of two a unit stands for. Every unit is binary,
// as in Docker's --memory: "m", "MB" and "MiB" all mean 1048576 bytes.
// Decimal (1000-based) units are deliberately absent, so that "512MB" in a
// config file means what it means on the docker command line.
func unitShift(unit string) (uint, bool) {
	switch unit {
	case "", "b":
		return 0, true
	case "k", "ki", "kb", "kib":
		return 10, true
	case "m", "mi", "mb", "mib":
		return 20, true
	case "g", "gi", "gb", "gib":
		return 30, true
	case "t", "ti", "tb", "tib":
		return 40, true
	case "p", "pi", "pb", "pib":
		return 50, true
	}
	return 0, false
}

// FormatBytes writes n in the largest binary unit that divides it exactly,
// so that the result reads back through ParseBytes to the same value:
// 1073741824 is "1GiB", 1610612736 is "1536MiB", and 100 is "100".
func FormatBytes(n int64) string {
	units := [...]struct {
		shift uint
		name  string
	}{{50, "PiB"}, {40, "TiB"}, {30, "GiB"}, {20, "MiB"}, {10, "KiB"}}
	for _, u := range units {
		if n != 0 && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10)
}

// isDecimal reports whether s is digits with an optional fraction, such as
// "12" or "1.25"; it excludes the signs, exponents, underscores and special
// values strconv.ParseFloat would accept.
func isDecimal(s string) bool {
	whole, frac, hasDot := strings.Cut(s, ".")
	return isDigits(whole) && (!hasDot || isDigits(frac))
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return false
		}
	}
	return true
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
