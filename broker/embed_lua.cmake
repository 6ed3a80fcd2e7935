# embed_lua.cmake - writes the text of IN as a NUL-terminated C array `broker_lua_text` to OUT.
file(READ ${IN} hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," hex "${hex}")
file(WRITE ${OUT} "/* generated from broker.lua by embed_lua.cmake: do not edit */\n"
                  "const char broker_lua_text[] = {${hex}0x00};\n")
