package acp

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
)

// readRaw returns the next line that is not blank, newline included, for a
// relay that forwards most lines untouched. A line that fits the read
// buffer is returned in place, without a copy: it is valid only until the
// next read. A last line without a newline gets one, unless it is no
// whole JSON value (the peer stopped in the middle). A line longer than
// the stream's bound is skipped and reported as errTooLong.
func (s *LineStream) readRaw() ([]byte, error) {
	for {
		line, err := s.r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			line, err = readRest(s.r, line, s.max)
			if errors.Is(err, io.EOF) && len(line) > 0 {
				err = nil
			}
		}
		if errors.Is(err, errTooLong) {
			return nil, err
		}
		if len(bytes.TrimSpace(line)) > 0 {
			if line[len(line)-1] != '\n' {
				if !json.Valid(line) {
					// Cut off by the peer's end: half a message
					// would reach the other side as one.
					return nil, io.EOF
				}
				line = append(line[:len(line):len(line)], '\n')
			}
			return line, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// writeRaw writes one line that already ends with its newline, in one
// write, so a reader never sees half a message.
func (s *LineStream) writeRaw(line []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_, err := s.w.Write(line)
	return err
}

// trimEOL returns line without its line ending.
func trimEOL(line []byte) []byte {
	return bytes.TrimRight(line, "\r\n")
}
