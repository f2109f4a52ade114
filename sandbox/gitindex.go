package sandbox

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// indexBudget bounds the bytes of index files that one look at a
// session's git metadata reads, all repositories together: an index is
// about a hundred bytes per tracked file, so this is millions of files,
// and a command that makes repositories with huge indexes (sparse files
// cost it nothing) cannot make every session start read gigabytes.
const indexBudget = 256 << 20

// gitlinks returns the paths, relative to the working tree, of the
// submodules recorded in a git index (entries of mode 160000): host git
// goes into every one of them that has a .git for `git status`, whether
// the submodule was ever set up or not. hashLen is the length of an object
// id (20 for SHA-1, 32 for SHA-256). A split index's shared part is read
// too. The bytes read are taken from *budget. A missing index has none;
// one that cannot be read whole, or beyond the budget, is an error, since
// a submodule left out would be left writable.
func gitlinks(indexFile string, hashLen int, budget *int64) ([]string, error) {
	top, err := readIndex(indexFile, hashLen, budget, nil, true)
	if err != nil || top.shared == "" {
		return top.links, err
	}
	// Entries the split part deletes are still listed: one path too many
	// is only a directory made read-only. A shared index that is gone
	// leaves the rest unknown: git itself cannot read such an index.
	sharedFile := filepath.Join(filepath.Dir(indexFile), "sharedindex."+top.shared)
	// A submodule that replaces an entry of the shared index has no name
	// of its own: it takes the name of the entry it replaces.
	at := make(map[int]bool, len(top.replacing))
	for _, pos := range top.replacing {
		at[pos] = true
	}
	base, err := readIndex(sharedFile, hashLen, budget, at, false)
	if err != nil {
		return nil, err
	}
	links := append(top.links, base.links...)
	for _, pos := range top.replacing {
		name, ok := base.named[pos]
		if !ok {
			return nil, fmt.Errorf("read git index %s: it replaces entry %d of its shared index, which has no such entry", indexFile, pos)
		}
		if localPath(name) {
			links = append(links, name)
		}
	}
	return links, nil
}

// indexRead is what readIndex finds in one index file.
type indexRead struct {
	links []string
	// shared is the hex id of the shared index a split index names, ""
	// for none; replacing holds, for each of its submodules that
	// replaces an entry there (and so has no name), that entry's place.
	shared    string
	replacing []int
	// named holds the names of the entries readIndex was asked for, by
	// place.
	named map[int]string
}

// readIndex reads one index file: its submodules, what it says of a shared
// index, and the names of the entries at the places in namesAt.
func readIndex(indexFile string, hashLen int, budget *int64, namesAt map[int]bool, optional bool) (indexRead, error) {
	var found indexRead
	fail := func(err error) (indexRead, error) {
		return indexRead{}, fmt.Errorf("read git index %s: %w", indexFile, err)
	}
	// Not following a link, and not waiting on a FIFO a command put
	// there.
	fd, err := unix.Open(indexFile, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) && optional {
		return found, nil // a repository without an index records nothing
	}
	if err != nil {
		return fail(err)
	}
	f := os.NewFile(uintptr(fd), indexFile)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fail(err)
	}
	if !fi.Mode().IsRegular() {
		return fail(errors.New("not a regular file"))
	}
	if *budget -= fi.Size(); *budget < 0 {
		return fail(fmt.Errorf("%d bytes, and the indexes of the session's repositories together more than the %d MiB sandboxd reads", fi.Size(), indexBudget>>20))
	}
	r := bufio.NewReader(io.LimitReader(f, fi.Size()))
	var hdr [12]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return fail(err)
	}
	if string(hdr[:4]) != "DIRC" {
		return fail(errors.New("no index signature"))
	}
	version := binary.BigEndian.Uint32(hdr[4:8])
	if version < 2 || version > 4 {
		return fail(fmt.Errorf("index version %d", version))
	}
	n := binary.BigEndian.Uint32(hdr[8:12])
	// ctime, mtime, dev, ino, mode, uid, gid, size, then the object id
	// and the flags.
	fixed := 40 + hashLen + 2
	entry := make([]byte, fixed+2)
	var prev []byte     // the path before, which version 4 paths build on
	var nameless []bool // for each entry without a name: is it a submodule
	// note records an entry's name where it is wanted. name is good only
	// until the next read.
	note := func(i uint32, gitlink bool, name []byte) {
		switch {
		case len(name) == 0:
			nameless = append(nameless, gitlink)
		case gitlink && localPath(string(name)):
			found.links = append(found.links, string(name))
		}
		if namesAt[int(i)] {
			if found.named == nil {
				found.named = make(map[int]string)
			}
			found.named[int(i)] = string(name)
		}
	}
	for i := uint32(0); i < n; i++ {
		if _, err := io.ReadFull(r, entry[:fixed]); err != nil {
			return fail(err)
		}
		flags := binary.BigEndian.Uint16(entry[fixed-2 : fixed])
		// git reads a name by this length, not by its NUL: a name whose
		// bytes say otherwise would be one path to git, another here.
		nameLen := int(flags & 0xfff)
		checkLen := func(name []byte) error {
			if len(name) != nameLen && (nameLen < 0xfff || len(name) < 0xfff) {
				return fmt.Errorf("entry %d: a name of %d bytes where its length says %d", i, len(name), nameLen)
			}
			return nil
		}
		size := fixed
		if flags&0x4000 != 0 {
			if version < 3 {
				return fail(errors.New("extended flags in a version 2 index"))
			}
			if _, err := io.ReadFull(r, entry[fixed:fixed+2]); err != nil {
				return fail(err)
			}
			size += 2
		}
		// Only a gitlink's path is made a string: an index holds one
		// entry per tracked file. It is taken before the padding is
		// read, which may refill the reader's buffer the path lies in.
		gitlink := binary.BigEndian.Uint32(entry[24:28])>>12 == 0o16
		if version == 4 {
			strip, err := readGitVarint(r)
			if err != nil || strip > uint64(len(prev)) {
				return fail(errors.New("bad path prefix"))
			}
			rest, err := readPath(r)
			if err != nil {
				return fail(err)
			}
			prev = append(prev[:len(prev)-int(strip)], rest...)
			if len(prev) > maxIndexPath {
				return fail(errors.New("a path longer than any file system takes"))
			}
			if err := checkLen(prev); err != nil {
				return fail(err)
			}
			note(i, gitlink, prev)
			continue
		}
		name, err := readPath(r)
		if err != nil {
			return fail(err)
		}
		if err := checkLen(name); err != nil {
			return fail(err)
		}
		note(i, gitlink, name)
		size += len(name) + 1
		// An entry is NUL-padded to a multiple of eight bytes.
		if pad := (8 - size%8) % 8; pad > 0 {
			if _, err := r.Discard(pad); err != nil {
				return fail(err)
			}
		}
	}
	// Extensions follow, each a signature and a length; the last bytes
	// are the file's own hash. Only "link" (a split index) matters here.
	for {
		var ext [8]byte
		if _, err := io.ReadFull(r, ext[:]); err != nil {
			break // the trailing hash, or the end
		}
		size := binary.BigEndian.Uint32(ext[4:])
		if string(ext[:4]) == "link" {
			if int64(size) > fi.Size() {
				return fail(errors.New("link extension longer than the file"))
			}
			body := make([]byte, size)
			if _, err := io.ReadFull(r, body); err != nil {
				return fail(fmt.Errorf("link extension: %w", err))
			}
			if len(body) < hashLen {
				return fail(errors.New("short link extension"))
			}
			found.shared = fmt.Sprintf("%x", body[:hashLen])
			// The id, then two bitmaps of places in the shared index:
			// the entries deleted, then those replaced, the nth set bit
			// by the nth entry without a name.
			var replaced []int
			if rest := body[hashLen:]; len(rest) > 0 {
				_, rest, err := readEWAH(rest, 0)
				if err == nil {
					replaced, _, err = readEWAH(rest, len(nameless))
				}
				if err != nil {
					return fail(fmt.Errorf("link extension: %w", err))
				}
			}
			for k, gitlink := range nameless {
				if !gitlink {
					continue
				}
				if k >= len(replaced) {
					return fail(errors.New("a submodule without a name replaces no entry of the shared index"))
				}
				found.replacing = append(found.replacing, replaced[k])
			}
			continue
		}
		if _, err := r.Discard(int(size)); err != nil {
			break
		}
	}
	if strings.Trim(found.shared, "0") == "" {
		found.shared = ""
	}
	if found.shared == "" && slices.Contains(nameless, true) {
		return fail(errors.New("a submodule without a name, and no shared index to name it"))
	}
	return found, nil
}

// maxEWAHBits bounds the places an index bitmap may name: more than an
// index holds entries, and an int on every platform.
const maxEWAHBits = 1<<31 - 1

// readEWAH reads one of git's compressed bitmaps (ewah/ewah_io.c): the
// number of bits, the number of 64-bit words, the words, and the place
// of the last run word. The words alternate: a run word (bit 0 the bit of
// the run, the next 32 its length in words, the top 31 how many literal
// words follow it), then its literal words. It returns the places of the
// first want set bits, in order, and what follows the bitmap: a run of
// ones a few bytes long may stand for billions of places.
func readEWAH(b []byte, want int) (set []int, rest []byte, err error) {
	if len(b) < 8 {
		return nil, nil, errors.New("short bitmap")
	}
	words := uint64(binary.BigEndian.Uint32(b[4:8]))
	if words*8+12 > uint64(len(b)) {
		return nil, nil, errors.New("bitmap longer than its extension")
	}
	w := b[8 : 8+8*words]
	rest = b[8+8*words+4:]
	var pos uint64
	for len(w) > 0 {
		rlw := binary.BigEndian.Uint64(w)
		w = w[8:]
		run, literals := rlw>>1&(1<<32-1), rlw>>33
		if pos+run*64 > maxEWAHBits {
			return nil, nil, errors.New("bitmap run too long")
		}
		if rlw&1 != 0 {
			for i := uint64(0); i < run*64 && len(set) < want; i++ {
				set = append(set, int(pos+i))
			}
		}
		pos += run * 64
		if literals > uint64(len(w))/8 || pos+literals*64 > maxEWAHBits {
			return nil, nil, errors.New("bitmap literals past its end")
		}
		for range literals {
			lit := binary.BigEndian.Uint64(w)
			w = w[8:]
			for bit := uint64(0); bit < 64 && len(set) < want; bit++ {
				if lit&(1<<bit) != 0 {
					set = append(set, int(pos+bit))
				}
			}
			pos += 64
		}
	}
	return set, rest, nil
}

// readGitVarint reads a number as git writes it in a version 4 index
// (varint.c): big-endian groups of seven bits, each group but the last
// with its high bit set and standing for one more than it holds, so that
// every number has one spelling. It is not the varint of encoding/binary.
func readGitVarint(r io.ByteReader) (uint64, error) {
	c, err := r.ReadByte()
	if err != nil {
		return 0, err
	}
	v := uint64(c & 0x7f)
	for c&0x80 != 0 {
		v++
		if v == 0 || v>>57 != 0 {
			return 0, errors.New("varint overflows")
		}
		if c, err = r.ReadByte(); err != nil {
			return 0, err
		}
		v = v<<7 + uint64(c&0x7f)
	}
	return v, nil
}

// readPath reads a NUL-terminated path and returns it without the NUL. The
// bytes are the reader's own, good until its next read; a path longer than
// the buffer is copied.
func readPath(r *bufio.Reader) ([]byte, error) {
	b, err := r.ReadSlice(0)
	if err == nil {
		return b[:len(b)-1], nil
	}
	if !errors.Is(err, bufio.ErrBufferFull) {
		return nil, err
	}
	long := append([]byte(nil), b...)
	for errors.Is(err, bufio.ErrBufferFull) && len(long) <= maxIndexPath {
		b, err = r.ReadSlice(0)
		long = append(long, b...)
	}
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			err = errors.New("a path longer than any file system takes")
		}
		return nil, err
	}
	return long[:len(long)-1], nil
}

// maxIndexPath bounds a path in an index: Linux takes 4096 bytes.
const maxIndexPath = 64 << 10

// localPath reports whether an index path names a place inside the working
// tree: relative, clean, with no .git on the way. Git writes no other, but
// an index a command wrote could hold one.
func localPath(p string) bool {
	if p == "" || path.IsAbs(p) || path.Clean(p) != p || p == ".." || strings.HasPrefix(p, "../") {
		return false
	}
	for c := range strings.SplitSeq(p, "/") {
		if strings.EqualFold(c, ".git") {
			return false
		}
	}
	return true
}
