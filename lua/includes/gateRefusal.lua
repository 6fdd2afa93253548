-- Maps the activity's gate and sale window to a refusal code, or nil when orders may be taken.
-- gate: pending | open | paused | closed | frozen (see setGate-1.lua).
local function gateRefusal(gate, startMs, endMs, now)
  if gate == false or gate == nil then return -9 end
  if gate == 'pending' then return -1 end
  if gate == 'closed' or gate == 'frozen' then return -2 end
  if gate == 'paused' then return -3 end
  if now < tonumber(startMs) then return -1 end
  if now >= tonumber(endMs) then return -2 end
  return nil
end
