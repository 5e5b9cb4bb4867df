package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/go-zeromq/zmq4"
)

// Message is one batch as a subscriber receives it.
type Message struct {
	Topic string
	Seq   uint64
	Batch Batch
	// Err is set, and Batch empty, for a message that does not decode.
	Err error
}

// Subscribe connects to the PUB endpoint addr (tcp://HOST:PORT), subscribes
// to topics starting with prefix ("" for all) and calls fn with each batch,
// in order, until ctx ends or fn returns false. It returns ctx's error, or
// the socket's when it fails or the publisher's connection ends (it does
// not reconnect: subscribe again).
func Subscribe(ctx context.Context, addr, prefix string, fn func(Message) bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.Dial(addr); err != nil {
		return fmt.Errorf("kvevents: connect to %s: %w", addr, err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, prefix); err != nil {
		return fmt.Errorf("kvevents: subscribe: %w", err)
	}
	for {
		msg, err := sub.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("kvevents: receive from %s: %w", addr, err)
		}
		if !fn(parseMessage(msg.Frames)) {
			return nil
		}
	}
}

func parseMessage(f [][]byte) Message {
	if len(f) != 3 || len(f[1]) != 8 {
		return Message{Err: fmt.Errorf("%w: %d frames", ErrMalformed, len(f))}
	}
	m := Message{Topic: string(f[0]), Seq: binary.BigEndian.Uint64(f[1])}
	m.Batch, m.Err = Decode(f[2])
	return m
}

// Replay asks the ROUTER endpoint addr for the buffered batches from
// sequence number from on and calls fn with each, in order, until the
// publisher's end marker; fn returning false stops early.
func Replay(ctx context.Context, addr string, from uint64, fn func(Message) bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A DEALER with REQ's envelope (an empty frame first): the publisher
	// answers one request with many messages, which a REQ would not take.
	req := zmq4.NewDealer(ctx)
	defer req.Close()
	if err := req.Dial(addr); err != nil {
		return fmt.Errorf("kvevents: connect to %s: %w", addr, err)
	}
	var sb [8]byte
	binary.BigEndian.PutUint64(sb[:], from)
	if err := req.SendMulti(zmq4.NewMsgFrom([]byte{}, sb[:])); err != nil {
		return fmt.Errorf("kvevents: replay request to %s: %w", addr, err)
	}
	for {
		msg, err := req.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("kvevents: replay from %s: %w", addr, err)
		}
		f := msg.Frames
		if len(f) > 0 && len(f[0]) == 0 {
			f = f[1:] // the envelope's empty frame
		}
		if len(f) == 2 && len(f[0]) == 8 && string(f[0]) == string(endSeq) {
			return nil
		}
		var m Message
		if len(f) == 2 && len(f[0]) == 8 {
			m = Message{Seq: binary.BigEndian.Uint64(f[0])}
			m.Batch, m.Err = Decode(f[1])
		} else {
			m.Err = fmt.Errorf("%w: replay answer of %d frames", ErrMalformed, len(f))
		}
		if !fn(m) {
			return nil
		}
	}
}
