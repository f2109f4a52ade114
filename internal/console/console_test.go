package console

import (
	"context"
	"io"
	"os"
	"syscall"
	"testing"
	"time"
)

func openPTY(t *testing.T) (ptm, pts *os.File) {
	t.Helper()
	ptm, pts, err := OpenPTY()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ptm.Close()
		pts.Close()
	})
	return ptm, pts
}

func TestIsTerminal(t *testing.T) {
	_, pts := openPTY(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	for _, tc := range []struct {
		name string
		f    *os.File
		want bool
	}{
		{"pty", pts, true},
		{"pipe", r, false},
	} {
		if got := IsTerminal(int(tc.f.Fd())); got != tc.want {
			t.Errorf("%s: IsTerminal = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestSizes(t *testing.T) {
	ptm, pts := openPTY(t)
	for _, size := range []Size{{80, 24}, {120, 50}, {1, 1}} {
		if err := SetSize(int(ptm.Fd()), size); err != nil {
			t.Fatal(err)
		}
		if got, err := SizeOf(int(pts.Fd())); err != nil || got != size {
			t.Errorf("SizeOf = %v, %v; want %v", got, err, size)
		}
	}
	// A terminal nobody sized does not know its size.
	for _, size := range []Size{{0, 0}, {80, 0}, {0, 24}} {
		if err := SetSize(int(ptm.Fd()), size); err != nil {
			t.Fatal(err)
		}
		if got, err := SizeOf(int(pts.Fd())); err == nil {
			t.Errorf("SizeOf of a %dx%d terminal = %v, want an error", size.Cols, size.Rows, got)
		}
	}
}

// TestRawAndRestore: raw mode turns off what would keep keys from the
// program (echo, line editing, Ctrl-C as a signal); Restore brings back
// the mode exactly.
func TestRawAndRestore(t *testing.T) {
	_, pts := openPTY(t)
	fd := int(pts.Fd())
	before, err := getTermios(fd)
	if err != nil {
		t.Fatal(err)
	}
	state, err := MakeRaw(fd)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := getTermios(fd)
	for _, flag := range []struct {
		name string
		set  bool
	}{
		{"ECHO", raw.Lflag&syscall.ECHO != 0},
		{"ICANON", raw.Lflag&syscall.ICANON != 0},
		{"ISIG", raw.Lflag&syscall.ISIG != 0},
		{"ICRNL", raw.Iflag&syscall.ICRNL != 0},
		{"OPOST", raw.Oflag&syscall.OPOST != 0},
	} {
		if flag.set {
			t.Errorf("%s still set in raw mode", flag.name)
		}
	}
	if err := state.Restore(); err != nil {
		t.Fatal(err)
	}
	if after, _ := getTermios(fd); *after != *before {
		t.Errorf("mode after Restore %+v, want %+v", *after, *before)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if _, err := MakeRaw(int(r.Fd())); err == nil {
		t.Error("MakeRaw of a pipe: no error")
	}
}

// TestWatchSendsTheNewSize: a change of size (SIGWINCH) comes with the
// terminal's new size.
func TestWatchSendsTheNewSize(t *testing.T) {
	ptm, pts := openPTY(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sizes := Watch(ctx, int(pts.Fd()))
	want := Size{Cols: 132, Rows: 43}
	if err := SetSize(int(ptm.Fd()), want); err != nil {
		t.Fatal(err)
	}
	// The pty is no controlling terminal here: send the signal that its
	// foreground would get.
	syscall.Kill(os.Getpid(), syscall.SIGWINCH)
	select {
	case got := <-sizes:
		if got != want {
			t.Errorf("size %v, want %v", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no size after SIGWINCH")
	}
}

// TestInputLeavesWhatComesAfterTheStop: once stop is closed, a read that
// waits ends with EOF, and input that comes later stays for the next
// reader (the user's shell, once the program in the sandbox ended).
func TestInputLeavesWhatComesAfterTheStop(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	stop := make(chan struct{})
	in, err := NewInput(r, stop)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	w.Write([]byte("before"))
	buf := make([]byte, 64)
	if n, err := in.Read(buf); err != nil || string(buf[:n]) != "before" {
		t.Fatalf("Read = %q, %v; want what came before the stop", buf[:n], err)
	}
	ended := make(chan error, 1)
	go func() {
		_, err := in.Read(buf) // waits: nothing to read
		ended <- err
	}()
	close(stop)
	if err := <-ended; err != io.EOF {
		t.Fatalf("waiting Read after the stop = %v, want EOF", err)
	}
	in.Close()
	w.Write([]byte("after"))
	if n, err := r.Read(buf); err != nil || string(buf[:n]) != "after" {
		t.Errorf("the next reader got %q, %v; want what came after the stop", buf[:n], err)
	}
}

// TestInputEndsAtCtrlD: Ctrl-D on a terminal (canonical mode) is the end
// of input, read as such, with nothing in the queue.
func TestInputEndsAtCtrlD(t *testing.T) {
	ptm, pts := openPTY(t)
	in, err := NewInput(pts, make(chan struct{}))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	ptm.Write([]byte("abc\n\x04"))
	buf := make([]byte, 64)
	if n, err := in.Read(buf); err != nil || string(buf[:n]) != "abc\n" {
		t.Fatalf("Read = %q, %v; want the line", buf[:n], err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := in.Read(buf)
		done <- err
	}()
	select {
	case err := <-done:
		if err != io.EOF {
			t.Errorf("Read after Ctrl-D = %v, want EOF", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Read after Ctrl-D did not end")
	}
}
