-- Forget jobs entirely (completed, failed, cancelled, or unknown to the database).
-- Key schema: hypermedia/queue/keys.py
-- KEYS: ready, leased, owner, delayed, prio
-- ARGV: job ids
local n = 0
for i = 1, #ARGV do
  local job = ARGV[i]
  n = n + redis.call('ZREM', KEYS[1], job) + redis.call('ZREM', KEYS[2], job)
      + redis.call('ZREM', KEYS[4], job)
  redis.call('HDEL', KEYS[3], job)
  redis.call('HDEL', KEYS[5], job)
end
return n
