"""Character tables for the prompt normaliser: look-alikes per script, Arabic letter variants,
traditional -> simplified Chinese for the characters the policy uses, script tests.

Every table maps to one "skeleton" so that a term and an evasive spelling of it fold to the same
string whichever direction the mixing goes: a Latin word written with Cyrillic or Greek letters
("nаkеd", "ΝΑΚΕD") folds to Latin, and a Russian word written with Latin look-alikes ("пoрнo")
folds to the same mixed skeleton as the Russian term itself, because terms go through the same
tables. The tables cover the common look-alikes (after Unicode's confusables.txt), not all of it.
"""
from __future__ import annotations

# Capital letters whose lower-case form looks different (Greek capital Nu "Ν" looks like N, its
# lower case "ν" like v): mapped *before* casefolding.
CAPITALS = {
    # Greek
    "Α": "a", "Β": "b", "Ε": "e", "Ζ": "z", "Η": "h", "Ι": "i", "Κ": "k", "Μ": "m", "Ν": "n",
    "Ο": "o", "Ρ": "p", "Τ": "t", "Υ": "y", "Χ": "x", "Ϲ": "c",
    # Cyrillic
    "А": "a", "В": "b", "Е": "e", "Ё": "e", "К": "k", "М": "m", "Н": "h", "О": "o", "Р": "p",
    "С": "c", "Т": "t", "Х": "x", "Ѕ": "s", "І": "i", "Ј": "j", "Ү": "y", "Ԛ": "q", "Ԝ": "w",
    # Armenian capitals that look Latin
    "Տ": "s", "Օ": "o",
}

# Lower-case look-alikes (applied after casefold).
LOWER = {
    # Cyrillic
    "а": "a", "в": "b", "е": "e", "ё": "e", "к": "k", "м": "m", "н": "h", "о": "o",
    "р": "p", "с": "c", "т": "t", "у": "y", "х": "x", "ѕ": "s", "і": "i", "ї": "i",
    "ј": "j", "ԁ": "d", "ԛ": "q", "ԝ": "w", "ѡ": "w", "ɡ": "g", "һ": "h", "ӏ": "l", "ү": "y",
    "ԍ": "g", "ԃ": "d", "ѵ": "v",
    # Armenian
    "ո": "n", "զ": "q", "օ": "o", "ս": "u", "հ": "h", "ց": "g", "ւ": "l", "ք": "p",
    # Greek
    "α": "a", "β": "b", "ε": "e", "η": "n", "ι": "i", "κ": "k", "ν": "v", "ο": "o",
    "ρ": "p", "τ": "t", "υ": "u", "χ": "x", "ω": "w", "γ": "y", "μ": "u", "ϲ": "c",
    "ϳ": "j", "ς": "s", "σ": "o", "ϱ": "p", "ϰ": "k",
    # Latin extensions / IPA / small capitals
    "ı": "i", "ȷ": "j", "ɑ": "a", "ɩ": "i", "ʟ": "l", "ɪ": "i", "ɴ": "n", "ʀ": "r",
    "ʏ": "y", "ᴀ": "a", "ʙ": "b", "ᴄ": "c", "ᴅ": "d", "ᴇ": "e", "ꜰ": "f", "ɢ": "g",
    "ʜ": "h", "ᴊ": "j", "ᴋ": "k", "ᴍ": "m", "ᴏ": "o", "ᴘ": "p", "ꞯ": "q", "ꜱ": "s",
    "ᴛ": "t", "ᴜ": "u", "ᴠ": "v", "ᴡ": "w", "ᴢ": "z", "ø": "o", "đ": "d", "ħ": "h",
    "ł": "l", "ŧ": "t", "ƅ": "b", "ɾ": "r", "ɵ": "o", "ɛ": "e", "ɜ": "e", "ƒ": "f",
    "ʋ": "v", "ɯ": "w", "ʍ": "w", "ɦ": "h", "ɭ": "l", "ɽ": "r", "ʂ": "s", "ʐ": "z",
    # Lisu (letters drawn as Latin capitals)
    "ꓐ": "b", "ꓑ": "p", "ꓒ": "d", "ꓓ": "d", "ꓔ": "t", "ꓕ": "t", "ꓖ": "g", "ꓗ": "k",
    "ꓘ": "k", "ꓙ": "j", "ꓚ": "c", "ꓛ": "c", "ꓜ": "z", "ꓝ": "f", "ꓞ": "f", "ꓟ": "m",
    "ꓠ": "n", "ꓡ": "l", "ꓢ": "s", "ꓣ": "r", "ꓤ": "r", "ꓥ": "v", "ꓦ": "v", "ꓧ": "h",
    "ꓨ": "h", "ꓩ": "x", "ꓪ": "w", "ꓫ": "x", "ꓬ": "y", "ꓭ": "b", "ꓮ": "a", "ꓯ": "a",
    "ꓰ": "e", "ꓱ": "e", "ꓲ": "i", "ꓳ": "o", "ꓴ": "u", "ꓵ": "u",
    # Cherokee letters that look like Latin capitals (lower-case forms after casefold)
    "ꭺ": "a", "ꮃ": "w", "ꮇ": "m", "ꮋ": "h", "ꮓ": "z", "ꮪ": "s", "ꮲ": "p", "ꮯ": "c",
    "ꭼ": "e", "ꮐ": "g", "ꮶ": "k", "ꮮ": "l", "ꮢ": "r", "ꮖ": "t", "ꮩ": "v", "ꭰ": "d",
    # typographic punctuation that should behave like ASCII
    "\u2018": "'", "\u2019": "'", "\u201b": "'", "\u2032": "'", "\u02bc": "'",
    "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-",
    "\u2212": "-", "\u00b7": ".", "\u2022": ".", "\u2219": ".", "\u30fb": ".",
    "\u2217": "*", "\u204e": "*", "\u2731": "*", "\u066d": "*", "\uff0a": "*",
}
# Regional indicator symbols (flag letters) U+1F1E6..U+1F1FF -> a..z
for _i in range(26):
    LOWER[chr(0x1F1E6 + _i)] = chr(ord("a") + _i)

# Arabic: hamza carriers and alef forms fold to bare alef, alef maqsura and Persian yeh to yeh,
# Persian kaf to kaf, teh marbuta to heh (spelling varies in prompts).
ARABIC = {
    "أ": "ا", "إ": "ا", "آ": "ا", "ٱ": "ا", "ى": "ي", "ی": "ي", "ئ": "ي", "ؤ": "و",
    "ک": "ك", "ة": "ه", "ـ": "",  # tatweel (kashida) is decoration
}

# Traditional -> simplified for the characters that occur in the policy's Chinese terms, so one
# spelling of a term covers both (體/体, 殺/杀, ...). Japanese shinjitai mostly equals simplified
# or traditional forms already present.
HANT_TO_HANS = {
    "體": "体", "殺": "杀", "屍": "尸", "腦": "脑", "頭": "头", "斬": "斩", "納": "纳",
    "色": "色", "情": "情", "愛": "爱", "淫": "淫", "穢": "秽", "強": "强", "姦": "奸",
    "肢": "肢", "解": "解", "腸": "肠", "傷": "伤", "割": "割", "腕": "腕", "殘": "残",
    "爆": "爆", "炸": "炸", "槍": "枪", "擊": "击", "屠": "屠", "種": "种", "族": "族",
    "滅": "灭", "絕": "绝", "兒": "儿", "童": "童", "戀": "恋", "幼": "幼", "蘿": "萝",
    "莉": "莉", "過": "过", "極": "极", "終": "终", "結": "结", "這": "这", "們": "们",
    "恐": "恐", "怖": "怖", "襲": "袭", "彈": "弹", "黨": "党", "衛": "卫", "軍": "军",
    "與": "与", "裸": "裸", "露": "露", "骯": "肮", "髒": "脏", "亂": "乱", "倫": "伦",
    "勢": "势", "潛": "潜", "輪": "轮", "鮮": "鲜", "門": "门",
    "吊": "吊", "縊": "缢", "膚": "肤", "陰": "阴", "莖": "茎", "徒": "徒",
}
HANT_TO_HANS = {k: v for k, v in HANT_TO_HANS.items() if k != v}


def is_cjk(ch: str) -> bool:
    """Han, kana and Hangul: scripts written without spaces between words (Korean has spaces
    but glues particles to words), so the policy matches their terms as substrings."""
    o = ord(ch)
    return (
        0x3040 <= o <= 0x30FF  # hiragana, katakana
        or 0x31F0 <= o <= 0x31FF  # katakana extensions
        or 0x3400 <= o <= 0x4DBF  # CJK ext A
        or 0x4E00 <= o <= 0x9FFF  # CJK unified
        or 0xF900 <= o <= 0xFAFF  # compatibility ideographs
        or 0xAC00 <= o <= 0xD7AF  # Hangul syllables
        or 0x1100 <= o <= 0x11FF  # Hangul jamo
        or 0x3130 <= o <= 0x318F  # Hangul compatibility jamo
        or 0xFF66 <= o <= 0xFF9F  # half-width katakana (NFKC widens them anyway)
    )


def is_arabic(ch: str) -> bool:
    o = ord(ch)
    return 0x0600 <= o <= 0x06FF or 0x0750 <= o <= 0x077F or 0x08A0 <= o <= 0x08FF
