"""The Lua scripts of the Redis index, each atomic across replicas: one per write
that changes several keys at once (a catalog's row with its names and stats, a
deletion, a batch of touches, a sequence's append), and the sequences' reader.
Their KEYS and ARGV are documented above each; redis_catalogs.py and
redis_sequences.py build them.
"""

# Shared by the name-writing scripts: make the name (alias) at ``alias_key`` (named
# ``alias``) name ``key`` unless it names another row that exists; a name naming a key
# with no row (deleted) is free. Returns 'created', 'same' or 'conflict', and the key
# the name names now. Each key's set of names follows, so that delete_entry finds
# them; SADD on SAME repairs the set of a name written before sets existed.
# ``entry_prefix`` and ``set_prefix`` are the namespace's entry and name-set key
# prefixes, to which a key is appended.
CLAIM_ALIAS = """
local function claim(alias_key, alias, key, entry_prefix, set_prefix)
  local named = redis.call('GET', alias_key)
  if named == key then
    redis.call('SADD', set_prefix .. key, alias)
    return 'same', key
  end
  if named and redis.call('EXISTS', entry_prefix .. named) == 1 then
    return 'conflict', named
  end
  redis.call('SET', alias_key, key)
  redis.call('SADD', set_prefix .. key, alias)
  if named then
    redis.call('SREM', set_prefix .. named, alias)
  end
  return 'created', key
end
"""

# Catalogs' put_new (redis_catalogs.py). KEYS[1] the row, KEYS[2] the namespace's
# keys, KEYS[3] its stats, KEYS[4] its access times, KEYS[5] its hits, KEYS[6] the set
# of namespaces, KEYS[7..] the names; ARGV[1] the row's JSON, ARGV[2] its key, ARGV[3]
# its stats JSON, ARGV[4] its created_at, ARGV[5] the namespace, ARGV[6] and ARGV[7]
# the prefixes claim() takes, ARGV[8..] the names, in the order of KEYS[7..]. Returns
# nil when stored, else the JSON of the row held.
PUT_ENTRY = (
    CLAIM_ALIAS
    + """
-- Listed whenever found too: an entry a server older than the listing wrote is
-- listed from its next put on (ZADD of a member already there changes nothing).
redis.call('ZADD', KEYS[2], 0, ARGV[2])
redis.call('SADD', KEYS[6], ARGV[5])
if not redis.call('SET', KEYS[1], ARGV[1], 'NX') then
  return redis.call('GET', KEYS[1])
end
-- Overwrites whatever an entry deleted under this key could have left.
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
redis.call('HSET', KEYS[4], ARGV[2], ARGV[4])
redis.call('HSET', KEYS[5], ARGV[2], 0)
for i = 7, #KEYS do
  claim(KEYS[i], ARGV[i + 1], ARGV[2], ARGV[6], ARGV[7])
end
return false
"""
)

# Catalogs' claim. KEYS[1] the row, KEYS[2] the name; ARGV[1] the key, ARGV[2] the
# name, ARGV[3] and ARGV[4] the prefixes claim() takes. Returns nil when there is no
# row to name, else {1 when written (0 when not), the key the name names now}.
ADD_ALIAS = (
    CLAIM_ALIAS
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return false
end
local result, named = claim(KEYS[2], ARGV[2], ARGV[1], ARGV[3], ARGV[4])
if result == 'created' then return {1, named} end
return {0, named}
"""
)

# KEYS[1] the entry, KEYS[2] the namespace's keys, KEYS[3] stats, KEYS[4] access
# times, KEYS[5] hits, KEYS[6] the key's set of aliases; ARGV[1] the key, ARGV[2] the
# expected created_at, ARGV[3] the namespace's alias key prefix. An alias in the set
# that names another key by now (re-pointed after a deletion that predates the sets)
# is left alone.
DELETE_ENTRY = """
local raw = redis.call('GET', KEYS[1])
if not raw or cjson.decode(raw)['created_at'] ~= tonumber(ARGV[2]) then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
for _, alias in ipairs(redis.call('SMEMBERS', KEYS[6])) do
  local alias_key = ARGV[3] .. alias
  if redis.call('GET', alias_key) == ARGV[1] then
    redis.call('DEL', alias_key)
  end
end
redis.call('DEL', KEYS[6])
return 1
"""

# Per touch, three KEYS (the entry, the namespace's access times, its hits) and three
# ARGV (the key, the time, the hits). Only an entry whose key exists is touched, so a
# touch racing a deletion never leaves stats behind. An entry written before access
# times were kept has none: the later of its created_at and EVICTION_SINCE (the last
# ARGV) stands in, as entry_stats reads it.
TOUCH_ENTRIES = """
for i = 1, #KEYS, 3 do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    local key, at = ARGV[i], ARGV[i + 1]
    local last = redis.call('HGET', KEYS[i + 1], key)
    if last then
      last = tonumber(last)
    else
      last = math.max(cjson.decode(redis.call('GET', KEYS[i]))['created_at'], tonumber(ARGV[#ARGV]))
    end
    if tonumber(at) > last then
      redis.call('HSET', KEYS[i + 1], key, at)
    end
    redis.call('HINCRBY', KEYS[i + 2], key, ARGV[i + 2])
  end
end
"""

# A log in a sorted set: each item is scored by its time, and its member starts with a
# zero-padded sequence, so members of one instant sort (and so read back) in order of
# appending; trimming drops the lowest ranks, the oldest by (time, sequence), the order
# the log is read in, so what is left is always a suffix of what was written.
LOG = """
local function log_add(log, seq_key, at, text)
  local member = string.format('%020d', redis.call('INCR', seq_key)) .. ' ' .. text
  redis.call('ZADD', log, at, member)
  return member
end
"""

# A sequence (redis_sequences.py). KEYS[1] the log, KEYS[2] its sequence, KEYS[3] its
# groups' bytes, KEYS[4..] the tag lists of this batch; ARGV[1] how many to keep,
# ARGV[2] ``before``, ARGV[3] how many per tag, ARGV[4] the lists' lifetime in ms (0:
# no expiry), ARGV[5] the tag lists' prefix, ARGV[6] how many to drop at most
# (TRIM_BATCH), ARGV[7] the groups' byte bound ('' for none), ARGV[8] the group sets'
# prefix, ARGV[9] how many groups to bound, then their names, then per item its time,
# its text ("<time> <JSON [group, head, tag]>" and a newline, then the body) and the
# index in KEYS of its tag's list (0 for none). A list item, and a group set's member,
# stand for the item's member in the log, so that what leaves the log leaves them
# too; the lists' expiry only reclaims keys nobody writes to again. An event stored
# before the group sets existed has no member in one: its bytes were never counted,
# and are not taken off. Returns 1 when more are due to be dropped.
APPEND_SEQUENCE = (
    LOG
    + r"""
local function escaped(ns)
  return (string.gsub(string.gsub(ns, '%%', '%%25'), ':', '%%3A'))
end
-- The group, the tag and the body's bytes of a log member.
local function facts(member)
  local header = string.match(member, '^%d+ %S+ ([^\n]*)')
  local fields = cjson.decode(header)
  return fields[1], fields[3], #member - string.find(member, '\n', 1, true)
end
local function ref(member, size)
  return string.sub(member, 1, 20) .. ' ' .. size
end
local function uncount(ns, size)
  if redis.call('HINCRBY', KEYS[3], ns, -size) <= 0 then redis.call('HDEL', KEYS[3], ns) end
end
-- Forget a member leaving the log (the caller removes it from the log).
local function forget(member)
  local ns, key, size = facts(member)
  if key ~= '' then redis.call('LREM', ARGV[5] .. escaped(ns) .. ':' .. key, 1, member) end
  if redis.call('ZREM', ARGV[8] .. escaped(ns), ref(member, size)) == 1 then uncount(ns, size) end
end
local function drop_oldest(members)
  if #members == 0 then return end
  for _, member in ipairs(members) do forget(member) end
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #members - 1)
end
-- The log's member of time ``at`` and sequence ``seq``, or nil: members of one time
-- follow every earlier one by rank, and sort among themselves by their sequence.
local function member_at(at, seq)
  local lo = redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. at)
  local hi = lo + redis.call('ZCOUNT', KEYS[1], at, at) - 1
  while lo <= hi do
    local mid = math.floor((lo + hi) / 2)
    local member = redis.call('ZRANGE', KEYS[1], mid, mid)[1]
    local found = string.sub(member, 1, 20)
    if found == seq then return member end
    if found < seq then lo = mid + 1 else hi = mid - 1 end
  end
  return nil
end
-- Drop the group's oldest while its bytes are over the bound, at most ``budget``;
-- returns how many it dropped.
local function trim_namespace(ns, bound, budget)
  local set = ARGV[8] .. escaped(ns)
  local dropped = 0
  while dropped < budget and tonumber(redis.call('HGET', KEYS[3], ns) or '0') > bound do
    local oldest = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
    if #oldest == 0 then
      redis.call('HDEL', KEYS[3], ns)
      break
    end
    local member = member_at(oldest[2], string.sub(oldest[1], 1, 20))
    if member then
      forget(member)
      redis.call('ZREM', KEYS[1], member)
    else
      -- Its event left the log without it (a trim by an older server): so do its bytes.
      redis.call('ZREM', set, oldest[1])
      uncount(ns, tonumber(string.match(oldest[1], ' (%d+)$')))
    end
    dropped = dropped + 1
  end
  return dropped
end
local bounded = tonumber(ARGV[9])
for i = 10 + bounded, #ARGV, 3 do
  local member = log_add(KEYS[1], KEYS[2], ARGV[i], ARGV[i + 1])
  local slot = tonumber(ARGV[i + 2])
  if slot > 0 then redis.call('LPUSH', KEYS[slot], member) end
  local ns, _, size = facts(member)
  redis.call('ZADD', ARGV[8] .. escaped(ns), ARGV[i], ref(member, size))
  redis.call('HINCRBY', KEYS[3], ns, size)
end
for j = 4, #KEYS do
  redis.call('LTRIM', KEYS[j], 0, tonumber(ARGV[3]) - 1)
  if tonumber(ARGV[4]) > 0 then redis.call('PEXPIRE', KEYS[j], ARGV[4]) end
end
-- The oldest by (time, sequence) are the lowest ranks: first those past ``before``,
-- then past ``keep``, then a namespace's past its bound.
local budget = tonumber(ARGV[6])
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[2], 'LIMIT', 0, budget)
drop_oldest(old)
budget = budget - #old
local excess = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[1])
if excess > 0 and budget > 0 then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, math.min(excess, budget) - 1)
  drop_oldest(oldest)
  budget = budget - #oldest
end
if redis.call('ZCARD', KEYS[1]) > tonumber(ARGV[1]) then return 1 end
if #redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[2], 'LIMIT', 0, 1) > 0 then
  return 1
end
if ARGV[7] ~= '' then
  local bound = tonumber(ARGV[7])
  for n = 10, 9 + bounded do
    budget = budget - trim_namespace(ARGV[n], bound, budget)
    if tonumber(redis.call('HGET', KEYS[3], ARGV[n]) or '0') > bound then return 1 end
  end
end
return 0
"""
)

# KEYS[1] a sequence's log; ARGV[1] the cursor's time, ARGV[2] its zero-padded sequence
# (members of that time up to it are skipped), ARGV[3] the exclusive upper bound
# "(<until>", ARGV[4] how many. Atomic, so that the count skipped is exact however the
# log changes between pages: a batch's events share one time, so one time can hold
# many members, and a cursor may stop among them (those it passed come first).
READ_SEQUENCE = """
local skip = 0
while true do
  local chunk = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[1], 'LIMIT', skip, 100)
  local passed = 0
  for _, member in ipairs(chunk) do
    if string.sub(member, 1, 20) > ARGV[2] then break end
    passed = passed + 1
  end
  skip = skip + passed
  if passed < 100 then break end
end
return redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[3], 'LIMIT', skip, ARGV[4])
"""
