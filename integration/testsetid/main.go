// Command testsetid is a command in a sandbox that asks the kernel for
// files with a setuid or setgid bit directly, through each system call that
// gives a file its mode, as a program in any language could. It makes its
// files in DIR and prints one line per try: its name, then "ok" or the
// error's name (EPERM, ENOSYS, ...).
//
//	testsetid DIR
package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"unsafe"
)

// System calls that package syscall does not name on every architecture:
// the numbers of the newer ones are the same on all but alpha, the legacy
// ones are amd64's (other architectures lack them).
const (
	sysOpenat2      = 437
	sysFchmodat2    = 452
	sysIoUringSetup = 425
	amd64Open       = 2
	amd64Creat      = 85
	amd64Chmod      = 90
	amd64Mkdir      = 83
	amd64Mknod      = 133
	oTmpfile        = 0o20000000 | syscall.O_DIRECTORY
	atFDCWD         = ^uintptr(99) // -100, AT_FDCWD
	atSymlinkFollow = 0x400
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: testsetid DIR")
		os.Exit(2)
	}
	dir := os.Args[1]
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	syscall.Umask(0)
	at := func(name string) string { return filepath.Join(dir, name) }
	plain := func(name string) string {
		p := at(name)
		os.WriteFile(p, nil, 0o644)
		return p
	}
	type try struct {
		name string
		do   func() error
	}
	tries := []try{
		{"openat-creat-4755", func() error {
			return closed(syscall.Open(at("openat-creat-4755"), syscall.O_CREAT|syscall.O_WRONLY, 0o4755))
		}},
		{"openat-creat-2755", func() error {
			return closed(syscall.Open(at("openat-creat-2755"), syscall.O_CREAT|syscall.O_WRONLY, 0o2755))
		}},
		{"openat-creat-0755", func() error {
			return closed(syscall.Open(at("openat-creat-0755"), syscall.O_CREAT|syscall.O_WRONLY, 0o755))
		}},
		{"openat-tmpfile-4755", func() error { return tmpfile(dir, at("openat-tmpfile-4755")) }},
		{"openat2-creat-4755", func() error { return openat2(at("openat2-creat-4755"), 0o4755) }},
		{"fchmod-4755", func() error {
			f, err := os.Open(plain("fchmod-4755"))
			if err != nil {
				return err
			}
			defer f.Close()
			return syscall.Fchmod(int(f.Fd()), 0o4755)
		}},
		{"fchmodat-2755", func() error { return fchmodat(syscall.SYS_FCHMODAT, plain("fchmodat-2755"), 0o2755) }},
		{"fchmodat-0755", func() error { return fchmodat(syscall.SYS_FCHMODAT, plain("fchmodat-0755"), 0o755) }},
		{"fchmodat2-4755", func() error { return fchmodat(sysFchmodat2, plain("fchmodat2-4755"), 0o4755) }},
		{"mknodat-4755", func() error { return syscall.Mknod(at("mknodat-4755"), syscall.S_IFREG|0o4755, 0) }},
		{"mkdirat-2755", func() error { return syscall.Mkdir(at("mkdirat-2755"), 0o2755) }},
		{"mkdirat-0755", func() error { return syscall.Mkdir(at("mkdirat-0755"), 0o755) }},
		{"io_uring_setup", func() error {
			var params [120]byte
			fd, _, errno := syscall.Syscall(sysIoUringSetup, 1, uintptr(unsafe.Pointer(&params)), 0)
			return closed(int(fd), errnoOf(errno))
		}},
	}
	if runtime.GOARCH == "amd64" {
		tries = append(tries,
			try{"open-creat-4755", func() error {
				return pathCall(amd64Open, at("open-creat-4755"), syscall.O_CREAT|syscall.O_WRONLY, 0o4755)
			}},
			try{"creat-2755", func() error { return pathCall(amd64Creat, at("creat-2755"), 0o2755, 0) }},
			try{"chmod-4755", func() error { return pathCall(amd64Chmod, plain("chmod-4755"), 0o4755, 0) }},
			try{"chmod-0755", func() error { return pathCall(amd64Chmod, plain("chmod-0755"), 0o755, 0) }},
			try{"mkdir-2755", func() error { return pathCall(amd64Mkdir, at("mkdir-2755"), 0o2755, 0) }},
			try{"mknod-2755", func() error { return pathCall(amd64Mknod, at("mknod-2755"), syscall.S_IFREG|0o2755, 0) }},
		)
	}
	for _, t := range tries {
		fmt.Println(t.name, result(t.do()))
	}
}

// result names err as the test reads it.
func result(err error) string {
	var errno syscall.Errno
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &errno):
		for _, e := range []struct {
			errno syscall.Errno
			name  string
		}{{syscall.EPERM, "EPERM"}, {syscall.ENOSYS, "ENOSYS"}, {syscall.EACCES, "EACCES"}, {syscall.EEXIST, "EEXIST"}} {
			if errno == e.errno {
				return e.name
			}
		}
		return fmt.Sprintf("errno-%d", int(errno))
	}
	return "error: " + err.Error()
}

func errnoOf(e syscall.Errno) error {
	if e != 0 {
		return e
	}
	return nil
}

// closed closes fd, which a call that succeeded opened.
func closed(fd int, err error) error {
	if err == nil {
		syscall.Close(fd)
	}
	return err
}

// pathCall makes a system call whose first argument is path.
func pathCall(nr uintptr, path string, a, b uintptr) error {
	p, err := syscall.BytePtrFromString(path)
	if err != nil {
		return err
	}
	r, _, errno := syscall.Syscall(nr, uintptr(unsafe.Pointer(p)), a, b)
	if errno == 0 && (nr == amd64Open || nr == amd64Creat) {
		syscall.Close(int(r))
	}
	return errnoOf(errno)
}

// fchmodat calls fchmodat or fchmodat2 (nr) on path.
func fchmodat(nr uintptr, path string, mode uint32) error {
	p, err := syscall.BytePtrFromString(path)
	if err != nil {
		return err
	}
	_, _, errno := syscall.Syscall6(nr, atFDCWD, uintptr(unsafe.Pointer(p)), uintptr(mode), 0, 0, 0)
	return errnoOf(errno)
}

// openat2 creates path with mode through openat2, whose mode lies in a
// struct open_how.
func openat2(path string, mode uint64) error {
	p, err := syscall.BytePtrFromString(path)
	if err != nil {
		return err
	}
	how := struct{ flags, mode, resolve uint64 }{syscall.O_CREAT | syscall.O_WRONLY, mode, 0}
	fd, _, errno := syscall.Syscall6(sysOpenat2, atFDCWD, uintptr(unsafe.Pointer(p)), uintptr(unsafe.Pointer(&how)), unsafe.Sizeof(how), 0, 0)
	return closed(int(fd), errnoOf(errno))
}

// tmpfile makes an unnamed file with a setuid mode in dir and links it as
// path, which needs no privilege through /proc/self/fd.
func tmpfile(dir, path string) error {
	fd, err := syscall.Open(dir, oTmpfile|syscall.O_WRONLY, 0o4755)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	from, err := syscall.BytePtrFromString(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		return err
	}
	to, err := syscall.BytePtrFromString(path)
	if err != nil {
		return err
	}
	_, _, errno := syscall.Syscall6(syscall.SYS_LINKAT, atFDCWD, uintptr(unsafe.Pointer(from)), atFDCWD, uintptr(unsafe.Pointer(to)), atSymlinkFollow, 0)
	return errnoOf(errno)
}
