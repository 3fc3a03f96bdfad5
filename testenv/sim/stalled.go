package sim

import (
	"context"
	"fmt"

	"github.com/coder/websocket"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
)

// StalledNode is a node that registers and then never reads again: the relay's writes to it
// back up in its socket and then in the relay's send queue for it.
type StalledNode struct {
	ws *websocket.Conn
}

// DialStalled connects node id, registers it, reads the registration answer and stops reading.
func DialStalled(ctx context.Context, url, id string) (*StalledNode, error) {
	ws, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		return nil, err
	}
	n := NewNode(id, nopLog)
	env := typedsocket.Envelope{Method: contracts.MethodRegisterPalletRuntimeSession, ID: "1",
		Phase: typedsocket.PhaseRequest, Request: n.RegistrationBody()}
	if err := ws.Write(ctx, websocket.MessageText, env.Append(nil)); err != nil {
		ws.CloseNow()
		return nil, err
	}
	_, msg, err := ws.Read(ctx)
	if err != nil {
		ws.CloseNow()
		return nil, err
	}
	answer, err := typedsocket.Decode(msg)
	if err != nil || answer.Error != nil {
		ws.CloseNow()
		return nil, fmt.Errorf("stalled node %s not registered: %v %v", id, err, answer.Error)
	}
	return &StalledNode{ws: ws}, nil
}

// Close drops the connection.
func (s *StalledNode) Close() { s.ws.CloseNow() }
