package console

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"unsafe"
)

// Size is a terminal's size in characters.
type Size struct {
	Cols, Rows uint
}

// IsTerminal reports whether fd is a terminal.
func IsTerminal(fd int) bool {
	_, err := getTermios(fd)
	return err == nil
}

// SizeOf returns the size of the terminal fd. A terminal whose size is
// 0x0 (one no emulator sized, a serial line) does not know it: that is an
// error, so that the caller picks a size of its own.
func SizeOf(fd int) (Size, error) {
	var ws struct{ Row, Col, X, Y uint16 }
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TIOCGWINSZ, uintptr(unsafe.Pointer(&ws))); errno != 0 {
		return Size{}, fmt.Errorf("terminal size of fd %d: %w", fd, errno)
	}
	if ws.Col == 0 || ws.Row == 0 {
		return Size{}, fmt.Errorf("terminal size of fd %d: unknown (%dx%d)", fd, ws.Col, ws.Row)
	}
	return Size{Cols: uint(ws.Col), Rows: uint(ws.Row)}, nil
}

// SetSize sets the size of the terminal fd, as a terminal emulator does
// when its window changes; the terminal's foreground processes get
// SIGWINCH.
func SetSize(fd int, size Size) error {
	ws := [4]uint16{uint16(size.Rows), uint16(size.Cols), 0, 0}
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TIOCSWINSZ, uintptr(unsafe.Pointer(&ws))); errno != 0 {
		return fmt.Errorf("set terminal size of fd %d: %w", fd, errno)
	}
	return nil
}

// OpenPTY opens a new pseudo-terminal: ptm is the side a terminal emulator
// holds, pts the terminal a program runs on.
func OpenPTY() (ptm, pts *os.File, err error) {
	ptm, err = os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open pty: %w", err)
	}
	var unlock int32
	var n uint32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, ptm.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); errno != 0 {
		ptm.Close()
		return nil, nil, fmt.Errorf("open pty: unlock: %w", errno)
	}
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, ptm.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); errno != 0 {
		ptm.Close()
		return nil, nil, fmt.Errorf("open pty: number: %w", errno)
	}
	pts, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		ptm.Close()
		return nil, nil, fmt.Errorf("open pty: %w", err)
	}
	return ptm, pts, nil
}

// State is a terminal's mode before MakeRaw changed it.
type State struct {
	fd  int
	old syscall.Termios
}

// MakeRaw puts the terminal fd in raw mode, as cfmakeraw(3) does: every
// key, Ctrl-C included, goes to the program in the sandbox, whose own
// terminal echoes and edits.
func MakeRaw(fd int) (*State, error) {
	old, err := getTermios(fd)
	if err != nil {
		return nil, fmt.Errorf("raw mode: %w", err)
	}
	raw := *old
	raw.Iflag &^= syscall.IGNBRK | syscall.BRKINT | syscall.PARMRK | syscall.ISTRIP | syscall.INLCR | syscall.IGNCR | syscall.ICRNL | syscall.IXON
	raw.Oflag &^= syscall.OPOST
	raw.Lflag &^= syscall.ECHO | syscall.ECHONL | syscall.ICANON | syscall.ISIG | syscall.IEXTEN
	raw.Cflag &^= syscall.CSIZE | syscall.PARENB
	raw.Cflag |= syscall.CS8
	raw.Cc[syscall.VMIN], raw.Cc[syscall.VTIME] = 1, 0
	if err := setTermios(fd, &raw); err != nil {
		return nil, fmt.Errorf("raw mode: %w", err)
	}
	return &State{fd: fd, old: *old}, nil
}

// Restore puts the terminal back in the mode it had.
func (s *State) Restore() error {
	if err := setTermios(s.fd, &s.old); err != nil {
		return fmt.Errorf("restore terminal: %w", err)
	}
	return nil
}

// Watch sends the size of the terminal fd each time it changes (SIGWINCH),
// until ctx ends.
func Watch(ctx context.Context, fd int) <-chan Size {
	sizes := make(chan Size, 1)
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	go func() {
		defer signal.Stop(winch)
		for {
			select {
			case <-ctx.Done():
				return
			case <-winch:
			}
			size, err := SizeOf(fd)
			if err != nil {
				continue
			}
			// Only the latest size matters: one not yet taken is replaced.
			select {
			case <-sizes:
			default:
			}
			sizes <- size
		}
	}()
	return sizes
}

func getTermios(fd int) (*syscall.Termios, error) {
	var t syscall.Termios
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TCGETS, uintptr(unsafe.Pointer(&t))); errno != 0 {
		return nil, errno
	}
	return &t, nil
}

func setTermios(fd int, t *syscall.Termios) error {
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TCSETS, uintptr(unsafe.Pointer(t))); errno != 0 {
		return errno
	}
	return nil
}
