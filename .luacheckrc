-- luacheck (make lint): the edge's Lua (roles/edge/files/lua) and its specs (tests/lua)
std = "luajit"
max_line_length = 120
-- nginx's Lua module: its one global
globals = { "ngx" }
files["tests/lua"] = { std = "+busted" }
