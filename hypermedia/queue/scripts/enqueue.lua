-- Put jobs in the ready set (new jobs, due retries, released or rescued leases).
-- Key schema: hypermedia/queue/keys.py
-- KEYS: ready, leased, owner, delayed, prio, wake, ended
-- ARGV: max_wake_tokens, then pairs of (priority, job_id)
-- A job that was leased or delayed leaves those sets: it is in exactly one set. A job
-- with a tombstone in ended was taken off as ended after this push's caller read it as
-- live (a cancel between a submit's commit and its push): it goes nowhere.
-- Returns how many were made ready.
local n = 0
for i = 2, #ARGV, 2 do
  local priority, job = ARGV[i], ARGV[i + 1]
  redis.call('ZREM', KEYS[2], job)
  redis.call('HDEL', KEYS[3], job)
  redis.call('ZREM', KEYS[4], job)
  if redis.call('ZSCORE', KEYS[7], job) then
    redis.call('HDEL', KEYS[5], job)
  else
    redis.call('ZADD', KEYS[1], priority, job)
    redis.call('HSET', KEYS[5], job, priority)
    n = n + 1
  end
end
if n > 0 then
  local tokens = math.min(n, tonumber(ARGV[1]))
  for _ = 1, tokens do redis.call('RPUSH', KEYS[6], '1') end
  redis.call('LTRIM', KEYS[6], -tonumber(ARGV[1]), -1)
end
return n
