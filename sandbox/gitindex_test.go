package sandbox

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// indexEntry is one entry of a test index.
type indexEntry struct {
	path string
	mode uint32
}

// writeIndex writes a git index of version with entries, as git lays it
// out, and the extensions given (signature, then body).
func writeIndex(t testing.TB, file string, version uint32, hashLen int, entries []indexEntry, exts ...[]byte) {
	t.Helper()
	var b bytes.Buffer
	b.WriteString("DIRC")
	binary.Write(&b, binary.BigEndian, version)
	binary.Write(&b, binary.BigEndian, uint32(len(entries)))
	prev := ""
	for i, e := range entries {
		start := b.Len()
		b.Write(make([]byte, 24))
		binary.Write(&b, binary.BigEndian, e.mode)
		b.Write(make([]byte, 12+hashLen))
		flags := uint16(min(len(e.path), 0xfff))
		extended := version >= 3 && i%2 == 1 // some entries carry extended flags
		if extended {
			flags |= 0x4000
		}
		binary.Write(&b, binary.BigEndian, flags)
		if extended {
			b.Write([]byte{0x20, 0}) // intent-to-add
		}
		if version == 4 {
			common := 0
			for common < len(prev) && common < len(e.path) && prev[common] == e.path[common] {
				common++
			}
			b.Write(appendGitVarint(nil, uint64(len(prev)-common)))
			b.WriteString(e.path[common:])
			b.WriteByte(0)
		} else {
			b.WriteString(e.path)
			b.WriteByte(0)
			for (b.Len()-start)%8 != 0 {
				b.WriteByte(0)
			}
		}
		prev = e.path
	}
	for _, x := range exts {
		b.Write(x)
	}
	b.Write(make([]byte, hashLen)) // the file's hash, which gitlinks does not check
	if err := os.WriteFile(file, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// appendGitVarint appends v as git's varint.c writes it.
func appendGitVarint(b []byte, v uint64) []byte {
	var buf [16]byte
	pos := len(buf) - 1
	buf[pos] = byte(v & 0x7f)
	for v >>= 7; v != 0; v >>= 7 {
		v--
		pos--
		buf[pos] = 0x80 | byte(v&0x7f)
	}
	return append(b, buf[pos:]...)
}

func TestGitVarint(t *testing.T) {
	// Spellings from git's own encoder.
	for _, tc := range []struct {
		v    uint64
		want []byte
	}{
		{0, []byte{0}},
		{127, []byte{0x7f}},
		{128, []byte{0x80, 0x00}},
		{255, []byte{0x80, 0x7f}},
		{16511, []byte{0xff, 0x7f}},
		{16512, []byte{0x80, 0x80, 0x00}},
	} {
		if got := appendGitVarint(nil, tc.v); !bytes.Equal(got, tc.want) {
			t.Errorf("appendGitVarint(%d) = %x, want %x", tc.v, got, tc.want)
		}
		got, err := readGitVarint(bytes.NewReader(tc.want))
		if err != nil || got != tc.v {
			t.Errorf("readGitVarint(%x) = %d, %v; want %d", tc.want, got, err, tc.v)
		}
	}
	if _, err := readGitVarint(bytes.NewReader(bytes.Repeat([]byte{0xff}, 12))); err == nil {
		t.Error("an overlong varint read without error")
	}
}

// ewah is git's compressed bitmap with the given places set, written
// plainly: one run word of no run, then every word as a literal.
func ewah(set ...int) []byte {
	n := 0
	for _, p := range set {
		n = max(n, p/64+1)
	}
	words := make([]uint64, n)
	for _, p := range set {
		words[p/64] |= 1 << (p % 64)
	}
	b := binary.BigEndian.AppendUint32(nil, uint32(n*64))
	b = binary.BigEndian.AppendUint32(b, uint32(n+1))
	b = binary.BigEndian.AppendUint64(b, uint64(n)<<33)
	for _, w := range words {
		b = binary.BigEndian.AppendUint64(b, w)
	}
	return binary.BigEndian.AppendUint32(b, 0)
}

func TestReadEWAH(t *testing.T) {
	// A run of ones: three words (192 places), then a literal.
	b := binary.BigEndian.AppendUint32(nil, 256)
	b = binary.BigEndian.AppendUint32(b, 2)
	b = binary.BigEndian.AppendUint64(b, 1|3<<1|1<<33)
	b = binary.BigEndian.AppendUint64(b, 1<<2)
	b = binary.BigEndian.AppendUint32(b, 0)
	b = append(b, "after"...)
	set, rest, err := readEWAH(b, 1000)
	if err != nil || len(set) != 193 || set[0] != 0 || set[191] != 191 || set[192] != 194 || string(rest) != "after" {
		t.Errorf("readEWAH = %d places (%v...), rest %q, %v", len(set), set[:min(3, len(set))], rest, err)
	}
	if set, _, _ := readEWAH(b, 2); len(set) != 2 {
		t.Errorf("readEWAH with want 2 gave %d places", len(set))
	}
	// A run word naming billions of places costs nothing.
	huge := binary.BigEndian.AppendUint32(nil, 0)
	huge = binary.BigEndian.AppendUint32(huge, 1)
	huge = binary.BigEndian.AppendUint64(huge, 1|(1<<25-1)<<1)
	huge = binary.BigEndian.AppendUint32(huge, 0)
	if set, _, err := readEWAH(huge, 3); err != nil || len(set) != 3 {
		t.Errorf("readEWAH of a huge run = %d places, %v", len(set), err)
	}
	for _, cut := range []int{0, 7, 12, len(b) - 6} {
		if _, _, err := readEWAH(b[:cut], 10); err == nil {
			t.Errorf("readEWAH of %d bytes: no error", cut)
		}
	}
}

func budget() *int64 {
	b := int64(indexBudget)
	return &b
}

func extension(sig string, body []byte) []byte {
	b := []byte(sig)
	b = binary.BigEndian.AppendUint32(b, uint32(len(body)))
	return append(b, body...)
}

func TestGitlinks(t *testing.T) {
	dir := t.TempDir()
	entries := []indexEntry{
		{"README", 0o100644},
		{"lib/a", 0o160000},
		{"lib/ab", 0o160000},
		{"lib/b/c.go", 0o100644},
		{"link", 0o120000},
		{"third_party/x y", 0o160000},
		{"tools", 0o040000}, // a sparse directory
		// Longer than the reader's buffer, then one whose padding
		// follows a refill.
		{"z/" + strings.Repeat("d/", 3000) + "mod", 0o160000},
		{"z/" + strings.Repeat("e", 4085) + "/mod", 0o160000},
	}
	want := []string{"lib/a", "lib/ab", "third_party/x y", "z/" + strings.Repeat("d/", 3000) + "mod", "z/" + strings.Repeat("e", 4085) + "/mod"}
	for _, tc := range []struct {
		name    string
		version uint32
		hashLen int
	}{
		{"version 2", 2, 20},
		{"version 3", 3, 20},
		{"version 4", 4, 20},
		{"version 2, SHA-256", 2, 32},
		{"version 4, SHA-256", 4, 32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_"))
			writeIndex(t, file, tc.version, tc.hashLen, entries, extension("TREE", []byte("whatever\x00")))
			got, err := gitlinks(file, tc.hashLen, budget())
			if err != nil || !slices.Equal(got, want) {
				t.Errorf("gitlinks = %q, %v; want %q", got, err, want)
			}
		})
	}

	t.Run("split index", func(t *testing.T) {
		sub := t.TempDir()
		id := bytes.Repeat([]byte{0xab}, 20)
		writeIndex(t, filepath.Join(sub, "sharedindex."+strings.Repeat("ab", 20)), 2, 20, []indexEntry{{"base/mod", 0o160000}, {"f", 0o100644}})
		writeIndex(t, filepath.Join(sub, "index"), 2, 20, []indexEntry{{"new/mod", 0o160000}}, extension("link", id))
		got, err := gitlinks(filepath.Join(sub, "index"), 20, budget())
		if w := []string{"new/mod", "base/mod"}; err != nil || !slices.Equal(got, w) {
			t.Errorf("gitlinks = %q, %v; want %q", got, err, w)
		}
	})

	t.Run("split index without its shared index", func(t *testing.T) {
		sub := t.TempDir()
		writeIndex(t, filepath.Join(sub, "index"), 2, 20, []indexEntry{{"new/mod", 0o160000}}, extension("link", bytes.Repeat([]byte{0xcd}, 20)))
		if _, err := gitlinks(filepath.Join(sub, "index"), 20, budget()); err == nil || !strings.Contains(err.Error(), "sharedindex.") {
			t.Errorf("gitlinks = %v, want an error naming the missing shared index", err)
		}
	})

	t.Run("split index replacing entries with submodules", func(t *testing.T) {
		sub := t.TempDir()
		var base []indexEntry
		for i := range 70 {
			base = append(base, indexEntry{fmt.Sprintf("f%02d", i), 0o100644})
		}
		writeIndex(t, filepath.Join(sub, "sharedindex."+strings.Repeat("ab", 20)), 2, 20, base)
		// f03 is deleted; f05 becomes a file again, f07 and f66 (past
		// the first bitmap word) submodules; the replacements come
		// first, without names.
		link := append(bytes.Repeat([]byte{0xab}, 20), ewah(3)...)
		link = append(link, ewah(5, 7, 66)...)
		for _, v := range []uint32{2, 4} {
			writeIndex(t, filepath.Join(sub, "index"), v, 20, []indexEntry{{"", 0o100644}, {"", 0o160000}, {"", 0o160000}, {"new/mod", 0o160000}}, extension("link", link))
			got, err := gitlinks(filepath.Join(sub, "index"), 20, budget())
			if want := []string{"new/mod", "f07", "f66"}; err != nil || !slices.Equal(got, want) {
				t.Errorf("version %d: gitlinks = %q, %v; want %q", v, got, err, want)
			}
		}
		// A nameless submodule the bitmap names no place for.
		writeIndex(t, filepath.Join(sub, "index"), 2, 20, []indexEntry{{"", 0o160000}}, extension("link", append(bytes.Repeat([]byte{0xab}, 20), append(ewah(), ewah()...)...)))
		if _, err := gitlinks(filepath.Join(sub, "index"), 20, budget()); err == nil {
			t.Error("a nameless submodule that replaces nothing: no error")
		}
	})

	t.Run("over the budget", func(t *testing.T) {
		file := filepath.Join(dir, "budget")
		writeIndex(t, file, 2, 20, entries)
		fi, err := os.Stat(file)
		if err != nil {
			t.Fatal(err)
		}
		left := 2*fi.Size() - 1
		if _, err := gitlinks(file, 20, &left); err != nil {
			t.Fatalf("first read within the budget: %v", err)
		}
		if _, err := gitlinks(file, 20, &left); err == nil || !strings.Contains(err.Error(), "MiB sandboxd reads") {
			t.Errorf("second read beyond the budget: %v", err)
		}
	})

	t.Run("a name whose length says otherwise", func(t *testing.T) {
		// git reads "sub" (the length in the flags), a NUL-reader
		// "sub/.git": the index is refused, not read either way.
		file := filepath.Join(dir, "namelen")
		writeIndex(t, file, 2, 20, []indexEntry{{"sub/.git", 0o160000}})
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		binary.BigEndian.PutUint16(b[12+60:], 3)
		if err := os.WriteFile(file, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := gitlinks(file, 20, budget()); err == nil {
			t.Errorf("gitlinks = %q, want the index refused", got)
		}
	})

	t.Run("no index", func(t *testing.T) {
		if got, err := gitlinks(filepath.Join(dir, "none"), 20, budget()); err != nil || got != nil {
			t.Errorf("gitlinks = %q, %v; want none", got, err)
		}
	})

	t.Run("paths out of the working tree are left out", func(t *testing.T) {
		file := filepath.Join(dir, "hostile")
		writeIndex(t, file, 2, 20, []indexEntry{{"../up", 0o160000}, {"/abs", 0o160000}, {"a/.git/b", 0o160000}, {"a//b", 0o160000}, {"ok", 0o160000}})
		if got, err := gitlinks(file, 20, budget()); err != nil || !slices.Equal(got, []string{"ok"}) {
			t.Errorf("gitlinks = %q, %v; want [ok]", got, err)
		}
	})

	for _, tc := range []struct {
		name, text string
	}{
		{"not an index", "hello, world"},
		{"version 5", "DIRC\x00\x00\x00\x05\x00\x00\x00\x00"},
		{"cut short", "DIRC\x00\x00\x00\x02\x00\x00\x00\x01\x00\x00"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_"))
			if err := os.WriteFile(file, []byte(tc.text), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := gitlinks(file, 20, budget()); err == nil || !strings.Contains(err.Error(), file) {
				t.Errorf("gitlinks of %s: %v, want an error naming the file", tc.name, err)
			}
		})
	}

	t.Run("a FIFO", func(t *testing.T) {
		file := filepath.Join(dir, "fifo")
		if err := syscall.Mkfifo(file, 0o644); err != nil {
			t.Skip(err)
		}
		if _, err := gitlinks(file, 20, budget()); err == nil {
			t.Error("gitlinks of a FIFO: no error")
		}
	})
}

// TestGitlinksOfRealGit reads indexes that git itself wrote, in each
// version, when the host has git.
func TestGitlinksOfRealGit(t *testing.T) {
	git, err := exec.LookPath("git")
	if err != nil {
		t.Skip("no git on this host")
	}
	repo := t.TempDir()
	run := func(args ...string) {
		t.Helper()
		cmd := exec.Command(git, append([]string{"-C", repo, "-c", "user.name=t", "-c", "user.email=t@t"}, args...)...)
		cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_SYSTEM=/dev/null")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
	}
	run("init", "-q")
	if err := os.WriteFile(filepath.Join(repo, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	run("add", "f")
	const commit = "0123456789abcdef0123456789abcdef01234567"
	run("update-index", "--add", "--cacheinfo", "160000,"+commit+",deps/one")
	run("update-index", "--add", "--cacheinfo", "160000,"+commit+",deps/two")
	// Version 4 strips more than 127 bytes of the path before from the
	// one after: a varint of two bytes.
	long := "deps/" + strings.Repeat("l", 200) + "/mod"
	run("update-index", "--add", "--cacheinfo", "160000,"+commit+","+long)
	run("update-index", "--add", "--cacheinfo", "160000,"+commit+",deps/zz")
	for _, v := range []string{"2", "3", "4"} {
		run("update-index", "--no-split-index")
		run("update-index", "--index-version", v)
		got, err := gitlinks(filepath.Join(repo, ".git", "index"), 20, budget())
		if want := []string{long, "deps/one", "deps/two", "deps/zz"}; err != nil || !slices.Equal(got, want) {
			t.Errorf("index version %s: gitlinks = %q, %v; want %q", v, got, err, want)
		}
	}
	// A split index, where a file becomes a submodule: git writes the
	// replacement without a name.
	run("update-index", "--index-version", "2")
	run("update-index", "--split-index")
	run("update-index", "--force-remove", "f")
	run("update-index", "--add", "--cacheinfo", "160000,"+commit+",f")
	run("update-index", "--add", "--cacheinfo", "160000,"+commit+",deps/new")
	got, err := gitlinks(filepath.Join(repo, ".git", "index"), 20, budget())
	slices.Sort(got)
	if want := []string{long, "deps/new", "deps/one", "deps/two", "deps/zz", "f"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("split index: gitlinks = %q, %v; want %q", got, err, want)
	}
}

// FuzzGitlinks: no index, however made, makes gitlinks panic or return a
// path out of the working tree.
func FuzzGitlinks(f *testing.F) {
	dir := f.TempDir()
	seed := filepath.Join(dir, "seed")
	for _, v := range []uint32{2, 3, 4} {
		writeIndex(f, seed, v, 20, []indexEntry{{"a/b", 0o160000}, {"a/c", 0o100644}, {"a/cd", 0o160000}})
		b, err := os.ReadFile(seed)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		file := filepath.Join(t.TempDir(), "index")
		if err := os.WriteFile(file, b, 0o644); err != nil {
			t.Fatal(err)
		}
		links, _ := gitlinks(file, 20, budget())
		for _, l := range links {
			if !localPath(l) {
				t.Errorf("gitlinks returned %q", l)
			}
		}
	})
}
