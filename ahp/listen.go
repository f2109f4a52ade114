package ahp

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/sandboxd/sandboxd/internal/jsonrpc"
)

// maxStrangers bounds the connections without a valid token that are
// answered at a time: each may wait some seconds for its first request.
const maxStrangers = 16

// URL is the address a client on this host connects to for a server
// listening on addr: one listening on every interface is reached on
// loopback (listening on :: takes IPv4 too).
func URL(addr net.Addr) string {
	if tcp, ok := addr.(*net.TCPAddr); ok && tcp.IP.IsUnspecified() {
		return "ws://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(tcp.Port)) + "/"
	}
	return "ws://" + addr.String() + "/"
}

// Listen serves on addr until ctx ends. It gives the address it listens
// on to ready before it serves anyone; an error from ready ends it. It is
// called once, before the server serves in any other way.
func (s *Server) Listen(ctx context.Context, addr string, ready func(net.Addr) error) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("ahp listen %s: %w", addr, err)
	}
	// The address bound, not the one asked for: with port 0 only this
	// one tells which endpoint a log line is about.
	s.log = s.log.With("ahp", ln.Addr().String())
	if ready != nil {
		if err := ready(ln.Addr()); err != nil {
			ln.Close()
			return err
		}
	}
	// Connections live in ctx: hijacked ones are beyond srv.Close.
	srv := &http.Server{Handler: s, BaseContext: func(net.Listener) context.Context { return ctx }, ReadHeaderTimeout: 10 * time.Second}
	// Every connection that is not upgraded was refused (no upgrade, a
	// foreign Origin, too many strangers): kept alive, it would hold a
	// descriptor and a goroutine for as long as the peer liked.
	srv.SetKeepAlivesEnabled(false)
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	err = srv.Serve(ln)
	s.Close()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func (s *Server) authorized(r *http.Request) bool {
	// The scheme is case-insensitive (RFC 9110); a header of another
	// scheme leaves the query's token to count.
	got := ""
	if scheme, cred, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "Bearer") {
		got = strings.TrimSpace(cred)
	}
	if got == "" {
		got = r.URL.Query().Get("token")
	}
	return s.cfg.Token != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.cfg.Token)) == 1
}

// protectedResources describes, as RFC 9728 metadata, what a client
// without the token needs one for: this endpoint (named by the address it
// was reached on, not by the request's Host, which the client wrote), with
// the token presented as a bearer token in the Authorization header or the
// token query parameter.
func protectedResources(r *http.Request) []map[string]any {
	resource := "ws://localhost/"
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		resource = "ws://" + a.String() + "/"
	}
	return []map[string]any{{
		"resource":                 resource,
		"resource_name":            "sandboxd AHP terminal channel (token in the file sandboxd printed at start)",
		"bearer_methods_supported": []string{"header", "query"},
		"required":                 true,
	}}
}

// ServeHTTP upgrades to WebSocket. A browser origin that is not allowed is
// refused at the handshake; a wrong token gets AuthRequired to its first
// request and the connection closes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	stranger := !s.authorized(r)
	if stranger {
		defer s.strangers.Add(-1)
		if s.strangers.Add(1) > maxStrangers {
			// Refused before the upgrade: a WebSocket close would wait
			// up to 5 s for the peer's answer, a connection held for
			// each of a flood of them.
			w.Header().Set("Retry-After", "10")
			http.Error(w, "too many connections without a valid token are waiting; try again later", http.StatusServiceUnavailable)
			return
		}
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{OriginPatterns: s.cfg.Origins})
	if err != nil {
		if n, ok := s.refusals.Allow(time.Now()); ok {
			s.log.Warn("ahp handshake refused", "remote", r.RemoteAddr, "origin", r.Header.Get("Origin"), "err", err, "not_logged", n)
		}
		return
	}
	ws.SetReadLimit(8 << 20)
	ctx := r.Context()
	if stranger {
		if n, ok := s.refusals.Allow(time.Now()); ok {
			s.log.Warn("ahp connection without a valid token", "remote", r.RemoteAddr, "not_logged", n)
		}
		// It gets one small request's time to learn why, not a
		// connection kept open by saying nothing, nor 8 MiB of memory.
		ws.SetReadLimit(64 << 10)
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, data, err := ws.Read(ctx)
		if err == nil {
			var m struct {
				ID json.RawMessage `json:"id"`
			}
			json.Unmarshal(data, &m)
			if len(m.ID) > 0 {
				b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": requestID(m.ID), "error": map[string]any{"code": jsonrpc.AuthRequired, "message": "authentication required: present the token sandboxd wrote at start", "data": map[string]any{"resources": protectedResources(r)}}})
				ws.Write(ctx, websocket.MessageText, b)
			}
		}
		ws.Close(websocket.StatusPolicyViolation, "authentication required")
		return
	}
	c := newConn(ctx, s, ws)
	s.mu.Lock()
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	c.run()
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}
