# embed_lua.cmake - writes the text of IN as a NUL-terminated C array NAME (default
# broker_lua_text) to OUT. Used for broker.lua and status.html.
if(NOT NAME)
    set(NAME broker_lua_text)
endif()
file(READ ${IN} hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," hex "${hex}")
file(WRITE ${OUT} "/* generated from ${IN} by embed_lua.cmake: do not edit */\n"
                  "const char ${NAME}[] = {${hex}0x00};\n")
