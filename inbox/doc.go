// Package inbox is the consumer's half of cdcrelay's delivery contract: it
// turns the relay's at-least-once delivery into effects applied once.
//
// The relay publishes every outbox row at least once, with the row's id as
// AMQP message_id and the (cdcrelay-timeline, cdcrelay-commit-lsn,
// cdcrelay-tx-index) headers, its order key (docs/messages.md). A consumer
// hands each amqp091 delivery to an Inbox
// with a handler name and a handler:
//
//   - Handle runs a handler that receives a pgx.Tx. The claim of
//     (message_id, handler) in the ledger table cdcrelay_inbox is written in
//     that same transaction, so the handler's database effects and the claim
//     commit together; the delivery is acked after the commit. A copy whose
//     claim is committed is acked without running the handler.
//   - HandleEffect runs a handler whose effects are outside the database (an
//     e-mail, an HTTP call). It claims the message with a lease (state
//     claimed, an owner token, lease_until) in a short transaction of its
//     own, renews the lease while the handler runs, and marks the claim done
//     with an UPDATE conditioned on its owner token. Two deliveries of one
//     message never run the handler at the same time while the lease is
//     renewed; a claim whose consumer crashed is taken over once its lease
//     has expired; a stale owner can never mark done, release or renew a
//     claim that another owner has taken over. Such a handler runs at least
//     once, and more than once only after a crash or a lost lease: it must
//     tolerate a retry (Event.Attempt says when it is one).
//
// Both tell the handler where the event stands among the events of its
// routing key (Event.Order), by the rule docs/messages.md states for a
// consumer on one queue: a message whose message_id has been seen is a
// redelivery (the Inbox acks it and the handler never sees it), whatever
// its position; a smaller position than one seen is not on its own a
// redelivery, because after the broker refused a message the refused
// event's first delivery comes after later ones. Such an event reaches the
// handler as OrderLate. Positions compare by timeline first (Position.Less):
// a promoted standby reuses the LSNs of the old primary's last
// transactions, so by commit LSN alone the new primary's events would be
// late. A message without the timeline header (an older relay) compares by
// commit LSN and index, as before; docs/consumers.md says where positions
// still go back (another database system, split brain).
//
// What happens to a delivery: after the handler succeeded, and for a
// duplicate, Ack. A delivery without message_id, and one whose handler
// failed, is Nacked without requeue, so the queue's dead-letter exchange
// (x-dead-letter-exchange, set by the caller) receives it; a handler error
// wrapped with Requeue, or one returned after the caller's context ended
// (a consumer shutting down), is Nacked with requeue instead. A failure of the
// inbox's own database work is Nacked with requeue: the message was not
// processed, and the ledger makes the retry safe. Poison messages are thus
// left to RabbitMQ's dead-lettering (a quorum queue's delivery-limit bounds
// requeues).
//
// The ledger's schema is Schema (applied by Migrate); done rows are deleted
// by Purge once they are older than the redelivery horizon. docs/consumers.md
// is the consumer contract with a complete example.
package inbox
