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
	links, shared, err := readGitlinks(indexFile, hashLen, budget)
	if err != nil || shared == "" {
		return links, err
	}
	// Entries the split part deletes are still listed: one path too many
	// is only a directory made read-only. A shared index that is gone
	// leaves the rest unknown: git itself cannot read such an index.
	sharedFile := filepath.Join(filepath.Dir(indexFile), "sharedindex."+shared)
	if _, err := os.Lstat(sharedFile); err != nil {
		return nil, fmt.Errorf("read git index %s: its shared index: %w", indexFile, err)
	}
	more, _, err := readGitlinks(sharedFile, hashLen, budget)
	return append(links, more...), err
}

// readGitlinks reads one index file: its gitlinks, and the hex id of the
// shared index a split index names ("" for none).
func readGitlinks(indexFile string, hashLen int, budget *int64) (links []string, shared string, err error) {
	fail := func(err error) ([]string, string, error) {
		return nil, "", fmt.Errorf("read git index %s: %w", indexFile, err)
	}
	// Not following a link, and not waiting on a FIFO a command put
	// there.
	fd, err := unix.Open(indexFile, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil, "", nil
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
	var prev []byte // the path before, which version 4 paths build on
	for i := uint32(0); i < n; i++ {
		if _, err := io.ReadFull(r, entry[:fixed]); err != nil {
			return fail(err)
		}
		flags := binary.BigEndian.Uint16(entry[fixed-2 : fixed])
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
			if gitlink && len(prev) == 0 {
				return fail(errors.New("a split index replaces an entry with a submodule; run `git update-index --no-split-index`"))
			}
			if gitlink && localPath(string(prev)) {
				links = append(links, string(prev))
			}
			continue
		}
		name, err := readPath(r)
		if err != nil {
			return fail(err)
		}
		if gitlink && len(name) == 0 {
			// A split index names an entry that replaces one of the
			// shared index by its place there, in a bitmap not read
			// here: the submodule cannot be told.
			return fail(errors.New("a split index replaces an entry with a submodule; run `git update-index --no-split-index`"))
		}
		if gitlink && localPath(string(name)) {
			links = append(links, string(name))
		}
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
			id := make([]byte, hashLen)
			if size < uint32(hashLen) {
				return fail(errors.New("short link extension"))
			}
			if _, err := io.ReadFull(r, id); err != nil {
				return fail(err)
			}
			shared = fmt.Sprintf("%x", id)
			size -= uint32(hashLen)
		}
		if _, err := r.Discard(int(size)); err != nil {
			break
		}
	}
	if strings.Trim(shared, "0") == "" {
		shared = ""
	}
	return links, shared, nil
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
