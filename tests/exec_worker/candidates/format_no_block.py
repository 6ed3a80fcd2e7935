no code here, just text
