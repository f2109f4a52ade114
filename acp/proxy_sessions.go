package acp

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/sourcegraph/jsonrpc2"

	"github.com/sandboxd/sandboxd/internal/jsonrpc"
	"github.com/sandboxd/sandboxd/sandbox"
)

// sessionCall is an editor's request that opens or ends a session.
type sessionCall struct {
	method string
	params json.RawMessage
}

// sessionAnswered prepares the container of a session the agent opened,
// loaded or resumed, and removes the container of one it closed or deleted.
func (p *Proxy) sessionAnswered(m message) {
	key := idKey(m.ID)
	p.mu.Lock()
	call, ok := p.sessionCalls[key]
	delete(p.sessionCalls, key)
	p.mu.Unlock()
	if !ok || (len(m.Error) > 0 && string(m.Error) != "null") {
		return
	}
	f, err := decodeFields(call.params, "")
	if err != nil {
		return
	}
	var sessionID, cwd string
	if get(f, "sessionId", false, &sessionID) != nil {
		return
	}
	switch call.method {
	case "session/close", "session/delete":
		p.closeSession(sessionID)
		return
	case "session/new":
		var res struct {
			SessionID string `json:"sessionId"`
		}
		if json.Unmarshal(m.Result, &res) != nil {
			return
		}
		sessionID = res.SessionID
	}
	if get(f, "cwd", false, &cwd) != nil || sessionID == "" || cwd == "" {
		return
	}
	spec := p.terms.scope.Defaults()
	// additionalDirectories is read as the agent reads it (the schema's
	// x-deserialize-skip-invalid-items): an item that is no string is
	// left out, the others are mounted.
	extra, _ := items[string](f, "additionalDirectories", nil)
	spec.ID, spec.Workspace, spec.ExtraDirs = sessionID, cwd, extra
	p.mu.Lock()
	before, open := p.specs[spec.ID]
	p.mu.Unlock()
	if !open {
		// A command may have opened it before the agent answered.
		before, open = p.terms.scope.ImplicitSpec(spec.ID)
	}
	if open && !sameMounts(before, spec) {
		// A container cannot gain or change mounts: a session loaded
		// again with other directories gets a new one, so that what the
		// editor names is what the agent's commands see.
		p.log.Info("session opened again with other directories; its container is replaced", "session", spec.ID, "cwd", cwd)
		p.closeSession(spec.ID)
	}
	p.mu.Lock()
	p.specs[spec.ID] = spec
	p.mu.Unlock()
	// Prepare reserves the session at once, so a terminal request that
	// follows waits for the container instead of finding no session.
	p.terms.scope.Prepare(spec)
}

// sameMounts tells whether two specs of a session mount the same
// directories: the same workspace, and the same additional directories in
// any order.
func sameMounts(a, b sandbox.SessionSpec) bool {
	extra := func(s sandbox.SessionSpec) []string {
		d := make([]string, len(s.ExtraDirs))
		for i, x := range s.ExtraDirs {
			d[i] = filepath.Clean(x)
		}
		slices.Sort(d)
		return slices.Compact(d)
	}
	return filepath.Clean(a.Workspace) == filepath.Clean(b.Workspace) && slices.Equal(extra(a), extra(b))
}

// closeSession forgets a session the agent closed, at once, so that a
// session/load or resume of the same id that follows is a new session; its
// container is removed in the background, since that takes a while and the
// agent's messages must keep flowing meanwhile.
func (p *Proxy) closeSession(id string) {
	// The editor has closed the session: its tool calls get no more
	// updates, also not the last one the kill of its terminals would give.
	p.updates.Lock()
	p.mu.Lock()
	for _, w := range p.textWatches {
		if w.sessionID == id {
			w.closed = true
		}
	}
	for _, w := range p.metaWatches {
		if w.sessionID == id {
			w.closed = true
			w.wakeUp() // one waiting to be shown again ends
		}
	}
	for k := range p.endedWatches {
		if k.session == id {
			delete(p.endedWatches, k)
		}
	}
	delete(p.specs, id)
	order := p.embedOrder[:0]
	for _, k := range p.embedOrder {
		if k.session == id {
			delete(p.embedded, k)
		} else {
			order = append(order, k)
		}
	}
	p.embedOrder = order
	p.mu.Unlock()
	p.updates.Unlock()
	remove := p.terms.scope.End(id)
	if remove == nil {
		return
	}
	p.work.Go(func() {
		if err := remove(context.WithoutCancel(p.ctx)); err != nil {
			p.log.Warn("close session", "session", id, "err", err)
		}
	})
}

// outsideContainer refuses a session/new, load or resume of a contained
// agent whose cwd or additionalDirectories the container does not show:
// its commands would run elsewhere than the editor shows, or not at all.
// A field the agent would read as absent is left to it.
func (p *Proxy) outsideContainer(m message) *jsonrpc2.Error {
	if !p.contained || m.Method == "session/close" || m.Method == "session/delete" {
		return nil
	}
	f, err := decodeFields(m.Params, "")
	if err != nil {
		return nil
	}
	var cwd string
	dirs := []string{}
	if get(f, "cwd", false, &cwd) == nil && cwd != "" {
		dirs = append(dirs, cwd)
	}
	extra, _ := items[string](f, "additionalDirectories", nil)
	for i, d := range append(dirs, extra...) {
		field := "cwd"
		if i >= len(dirs) {
			field = fmt.Sprintf("additionalDirectories[%d]", i-len(dirs))
		}
		if err := p.terms.scope.CheckDir(field, d); err != nil {
			return &jsonrpc2.Error{Code: jsonrpc.InvalidParams, Message: fmt.Sprintf(
				"sandboxd wrap --contain: %s: %q is not in the agent's container, which shows only the workspace %s (where sandboxd was started): start it in a directory that holds %s",
				field, d, p.terms.scope.Workspace(), d)}
		}
	}
	return nil
}

// refuseToEditor answers an editor's request itself, with rerr, in place
// of the agent.
func (p *Proxy) refuseToEditor(m message, rerr *jsonrpc2.Error) {
	p.log.Warn("refused a session the contained agent's container does not show", "method", m.Method, "err", rerr.Message)
	b, err := marshal(response{JSONRPC: "2.0", ID: m.ID, Error: rerr})
	if err != nil {
		return
	}
	p.editor.writeLater(b)
}
