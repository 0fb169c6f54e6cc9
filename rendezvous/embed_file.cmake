# cmake -DIN=file -DOUT=file.c -DNAME=symbol -P embed_file.cmake
# Writes IN's bytes as `const char NAME[]` (NUL-terminated) and `NAME_len`.
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" nhex)
math(EXPR len "${nhex} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){16})" "\\1\n" body "${body}")
file(WRITE "${OUT}" "/* Generated from ${IN} by embed_file.cmake: do not edit. */\n#include <stddef.h>\n"
     "const char ${NAME}[] = {\n${body}0x00};\nconst size_t ${NAME}_len = ${len};\n")
