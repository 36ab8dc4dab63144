-- Publish a job's event: appended to its capped stream (for late subscribers), the
-- stream's life renewed, and published on the channel of the same name with the
-- entry's id (a subscriber that read the stream first drops what it has seen).
-- Key schema: hypermedia/queue/keys.py
-- KEYS: the job's events key
-- ARGV: event JSON, entries kept, seconds to keep the stream after this event
local id = redis.call('XADD', KEYS[1], 'MAXLEN', ARGV[2], '*', 'e', ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('PUBLISH', KEYS[1], id .. ' ' .. ARGV[1])
return id
