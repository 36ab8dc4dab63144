-- Forget jobs entirely (completed, failed, cancelled, or unknown to the database).
-- Key schema: hypermedia/queue/keys.py
-- KEYS: ready, leased, owner, delayed, prio, ended
-- ARGV: now_ms, keep_ms, then job ids. keep_ms > 0: the jobs ended, and each gets a
--       tombstone in ended (score now_ms) that pushes honour; entries older than
--       keep_ms are trimmed and the key lives keep_ms past this call. keep_ms = 0: no
--       tombstone (a live job cleared before it is restored elsewhere).
local now, keep = tonumber(ARGV[1]), tonumber(ARGV[2])
local n = 0
for i = 3, #ARGV do
  local job = ARGV[i]
  n = n + redis.call('ZREM', KEYS[1], job) + redis.call('ZREM', KEYS[2], job)
      + redis.call('ZREM', KEYS[4], job)
  redis.call('HDEL', KEYS[3], job)
  redis.call('HDEL', KEYS[5], job)
  if keep > 0 then redis.call('ZADD', KEYS[6], now, job) end
end
if keep > 0 and #ARGV > 2 then
  redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', '(' .. string.format('%.0f', now - keep))
  redis.call('PEXPIRE', KEYS[6], keep)
end
return n
