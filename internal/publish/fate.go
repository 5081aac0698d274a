package publish

// This file is the broker side's one fate table: what becomes of an event
// after each thing the client library or the broker can say about its
// message. Every outcome is classified once, where it is learned, into a
// cause; decide maps the cause and the configured policy to an action; the
// site that learned the outcome carries the action out. No other code reads
// Poison, Unroutable or DeadLetterExchange to choose a fate (fate_test.go
// writes the whole table out). Where a cause's row is the same under every
// policy (the actRetry causes, causeEncode, causeCopyNotTaken), its site
// carries that action out without asking and names the cause in a
// comment; the table test pins such a row, so changing it fails until the
// site changes too.

// cause is what was learned about one message.
type cause int

// The causes.
const (
	// causeContent: the event can never become a valid message, known
	// before anything is sent: its content fails validation (poisonReason),
	// the client library's limits (MessageOn, unsendableReason), or an
	// earlier session remembered it as refused (Refusals).
	causeContent cause = iota
	// causeEncode: the client library refused to encode it while
	// publishing (EncodeError).
	causeEncode
	// causeBrokerRefused: the broker closed the channel with 406
	// PRECONDITION_FAILED while the message was alone in flight: a header
	// the broker rejects, or a body above its max_message_size.
	causeBrokerRefused
	// causeUnroutable: the broker returned the message (basic.return).
	causeUnroutable
	// causeNoExchange: the broker closed the channel with 404 NOT_FOUND
	// while the message was alone in flight, and the exchange came from
	// its row's exchange column.
	causeNoExchange
	// causeNack: a queue refused the message (basic.nack).
	causeNack
	// causeClosed: the broker closed the channel and no one message is to
	// blame: several were in flight, the configured exchange is missing,
	// or the broker had trouble of its own.
	causeClosed
	// causeTransport: the publish failed on the transport, or the
	// connection closed.
	causeTransport
	// causeTimeout: no confirm within ConfirmTimeout (a blocked broker's
	// pause excepted).
	causeTimeout
	// causeCopyNotTaken: a parked event's dead-letter copy was nacked or
	// returned.
	causeCopyNotTaken
	// causeCopyRefused: the broker closed the channel (406 or 404) while a
	// dead-letter copy was alone in flight.
	causeCopyRefused
)

// action is what becomes of the event.
type action int

// The actions.
const (
	// actRetry ends the session; the next one publishes the event again
	// (one message at a time after a refusal: Carryover).
	actRetry action = iota
	// actRemember ends the session and remembers the refusal (Refusals, or
	// Carryover's refused copies): the next session meets the event as
	// causeContent, or parks it without a copy, and never sends it again.
	actRemember
	// actStall ends the session on the row and names it as stalled
	// (Carryover.stall): every next session publishes it again, first.
	actStall
	// actStop ends the relay with ErrPoison naming the event.
	actStop
	// actPark parks the row (Acker.Parked) and the stream goes on.
	actPark
	// actParkCopy parks the row once its dead-letter copy's fate is known
	// (unless the broker refused that copy before: then at once, without
	// it).
	actParkCopy
)

// policy is what the configuration says about fates.
type policy struct {
	unroutable UnroutablePolicy
	poison     PoisonPolicy
	deadLetter bool // a dead-letter exchange is configured
}

// policy reads the configured policy, the one place that does.
func (c *PublisherConfig) policy() policy {
	return policy{unroutable: c.Unroutable, poison: c.Poison, deadLetter: c.DeadLetterExchange != ""}
}

// fate is what becomes of an event after c, under the configured policy.
func (p *Publisher) fate(c cause) action { return decide(c, p.policy()) }

// decide is the fate table. Why each row is what it is:
//
//   - causeContent: the row's own content, so retrying can never help: the
//     poison policy applies (poisonFate).
//   - causeEncode, causeBrokerRefused: also the row's content, but learned
//     only after part of the message may have gone out (the library shuts
//     the connection down after a frame error; the broker closed the
//     channel), so the session ends and the next one, which knows, applies
//     the poison policy before sending anything (actRemember).
//   - causeUnroutable: with CDCRELAY_UNROUTABLE=stall the row waits for a
//     binding, in order; with park it is poison, and the poison policy
//     applies.
//   - causeNoExchange: as unroutable, except that parking waits for the
//     next session (the broker closed the channel), which meets the row as
//     causeContent.
//   - causeNack, causeClosed, causeTransport, causeTimeout: the broker's or
//     the network's trouble, never the row's: they never count as poison
//     and the event is published again (invariant 3, docs/architecture.md).
//   - causeCopyNotTaken: a dead-letter copy's fate is only counted; the row
//     is parked anyway, so a copy never stalls anything (invariant 3).
//   - causeCopyRefused: the copy is not sent again; the row is parked by
//     the next session, without it.
func decide(c cause, pol policy) action {
	switch c {
	case causeContent:
		return poisonFate(pol)
	case causeEncode, causeBrokerRefused, causeCopyRefused:
		return actRemember
	case causeUnroutable:
		if pol.unroutable != ParkUnroutable {
			return actStall
		}
		return poisonFate(pol)
	case causeNoExchange:
		if pol.unroutable != ParkUnroutable {
			return actStall
		}
		return actRemember
	case causeCopyNotTaken:
		return actPark
	case causeNack, causeClosed, causeTransport, causeTimeout:
		return actRetry
	}
	return actRetry
}

// poisonFate is the poison policy: stop, or park (with a dead-letter copy
// when a dead-letter exchange is configured).
func poisonFate(pol policy) action {
	switch {
	case pol.poison == Stop:
		return actStop
	case pol.deadLetter:
		return actParkCopy
	}
	return actPark
}
