package publish

import (
	"regexp"
	"strconv"
)

// brokerMaxSize matches RabbitMQ's refusal of a message above its
// max_message_size, in the wording of 3.8 to 4.x ("message size N is
// larger than configured max size M") and of older releases ("message
// size N larger than max size M"). The broker sends it as the reason of a
// 406 PRECONDITION_FAILED channel close; amqp091-go prefixes nothing to
// Error.Reason but quotes it inside Error.Error(), so the match is not
// anchored.
var brokerMaxSize = regexp.MustCompile(`message size (\d+) (?:is )?larger than (?:configured )?max size (\d+)`)

// BrokerMaxMessageSize extracts the broker's max_message_size M from the
// reason text of the channel close RabbitMQ sends when a publish is larger
// than it (`PRECONDITION_FAILED - message size N is larger than configured
// max size M`). ok is false for any other text, so a caller can tell a size
// refusal, which no retry cures, from every other precondition failure.
func BrokerMaxMessageSize(reason string) (limit int64, ok bool) {
	m := brokerMaxSize.FindStringSubmatch(reason)
	if m == nil {
		return 0, false
	}
	limit, err := strconv.ParseInt(m[2], 10, 64)
	if err != nil || limit <= 0 {
		return 0, false // digits beyond int64, or a zero limit no broker sends
	}
	return limit, true
}
