package acp

import (
	"context"
	"encoding/json"
)

// answerTerminal answers a terminal request of the agent in the session's
// container, in the background: wait_for_exit may take long.
func (p *Proxy) answerTerminal(m message) {
	key := idKey(m.ID)
	p.mu.Lock()
	_, dup := p.agentCalls[key]
	p.mu.Unlock()
	if dup {
		p.replyToAgentLater(m, nil, duplicateID(string(m.ID)))
		return
	}
	release, err := p.limit.acquire(m.Method, len(m.Params)+2*len(m.ID))
	if err != nil {
		p.replyToAgentLater(m, nil, err)
		return
	}
	ctx, cancel := context.WithCancel(p.ctx)
	p.mu.Lock()
	p.agentCalls[key] = cancel
	p.mu.Unlock()
	forget := func() {
		p.mu.Lock()
		delete(p.agentCalls, key)
		p.mu.Unlock()
		cancel()
	}
	started := p.work.Go(func() {
		defer release() // after the reply is written: it holds the memory
		res, built, err := p.limit.run(ctx, p.terms, m.Method, m.Params)
		defer built() // after the reply is written
		// Before the reply: the agent may reuse the id as soon as it has it.
		forget()
		p.replyToAgent(m, res, err)
	})
	if !started {
		forget()
		release()
	}
}

// terminalNotified runs a terminal/kill or terminal/release the agent sent
// as a notification: done, but not answered.
func (p *Proxy) terminalNotified(m message) {
	release, err := p.limit.acquire(m.Method, len(m.Params))
	if err != nil {
		p.log.Warn("terminal notification from the agent not run", "method", m.Method, "err", err)
		return
	}
	started := p.work.Go(func() {
		defer release()
		_, built, err := p.limit.run(p.ctx, p.terms, m.Method, m.Params)
		built()
		if err != nil {
			p.log.Warn("terminal notification from the agent", "method", m.Method, "err", err)
		}
	})
	if !started {
		release()
	}
}

// replyToAgent answers an agent's request with res, or with err.
func (p *Proxy) replyToAgent(m message, res any, err error) {
	b, err := p.reply(m, res, err)
	if err == nil {
		err = p.agent.WriteLine(b)
	}
	if err != nil {
		p.log.Debug("reply to agent", "method", m.Method, "err", err)
	}
}

// replyToAgentLater is replyToAgent for the reader of the agent's
// messages: the reply is queued, since an agent that blocks writing its
// stdout while its stdin is full would otherwise wait for the reader as the
// reader waits for it.
func (p *Proxy) replyToAgentLater(m message, res any, err error) {
	b, err := p.reply(m, res, err)
	if err != nil {
		p.log.Debug("reply to agent", "method", m.Method, "err", err)
		return
	}
	p.agent.writeLater(b)
}

func (p *Proxy) reply(m message, res any, err error) ([]byte, error) {
	reply := response{JSONRPC: "2.0", ID: m.ID}
	if err != nil {
		reply.Error = rpcError(p.ctx, err)
	} else {
		reply.Result = res
	}
	return marshal(reply)
}

// cancelAgentCall cancels the agent's terminal request that a
// $/cancel_request names, and answers the cancellation when it was sent
// as a request. It reports whether the request named is the proxy's.
func (p *Proxy) cancelAgentCall(m message) bool {
	var c struct {
		RequestID json.RawMessage `json:"requestId"`
	}
	if json.Unmarshal(m.Params, &c) != nil {
		return false
	}
	p.mu.Lock()
	cancel, ok := p.agentCalls[idKey(c.RequestID)]
	_, dup := p.agentCalls[idKey(m.ID)]
	p.mu.Unlock()
	switch {
	case !ok:
		return false
	case m.isRequest() && dup:
		// Its answer could not be told from the answer to the request
		// in flight under the same id, which goes on.
		p.replyToAgentLater(m, nil, duplicateID(string(m.ID)))
		return true
	}
	cancel()
	if m.isRequest() {
		p.replyToAgentLater(m, json.RawMessage("null"), nil)
	}
	return true
}
